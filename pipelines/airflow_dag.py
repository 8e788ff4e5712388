"""An Airflow DAG that runs the training pipeline every six hours: an example to copy into a DAG folder.

Airflow is not a dependency of recsys-rl; the scheduler's workers need recsys-rl installed and the
config file in reach. One task is enough: ``recsys-rl pipeline run`` chains its own steps, records each
one, and resumes an unfinished run, so a retry after a failure (or a worker lost mid-run) picks up where
the failed attempt stopped instead of starting over. The registry lock makes overlapping runs fail fast
rather than race, so ``max_active_runs=1`` is a courtesy, not what keeps the registry safe.

The same schedule with cron, on a machine with recsys-rl installed:

    0 */6 * * *  recsys-rl pipeline run --config /etc/recsys-rl/pipeline.yaml >> /var/log/recsys-rl.log 2>&1
"""

from __future__ import annotations

import datetime as dt

from airflow import DAG
from airflow.operators.bash import BashOperator

PIPELINE_CONFIG = "/etc/recsys-rl/pipeline.yaml"

with DAG(
    dag_id="recsys_rl_training_pipeline",
    description="Kafka -> transitions -> features -> train -> OPE gate -> registry -> canary",
    schedule=dt.timedelta(hours=6),
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,  # each run ingests everything new since the last commit: missed slots need no backfill
    max_active_runs=1,
    default_args={"retries": 3, "retry_delay": dt.timedelta(minutes=10)},
) as dag:
    BashOperator(
        task_id="pipeline_run",
        bash_command=f"recsys-rl pipeline run --config {PIPELINE_CONFIG}",
        execution_timeout=dt.timedelta(hours=4),
    )
