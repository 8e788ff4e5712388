"""Offline policy evaluation (DESIGN 8), from estimators to the verdict that gates a rollout.

The estimators: ``logged`` (the logs as ``LoggedSteps``), ``estimators`` and ``sequential`` (single-
decision and per-session estimators), ``reward_model``, ``linear``, ``intervals``, ``diagnostics`` and
``offline_evaluation`` (every estimator on every signal, with intervals: the result dicts the gate and
the report read). The rollout decision: ``gate`` (the rules), ``blessing`` (the verdict bound to the
policy's weights), ``report`` (the HTML page) and ``evaluate`` (``recsys-rl evaluate``, all of it on one
candidate).
"""

from recsys_rl.ope.logged import LoggedSteps, target_log_prob
from recsys_rl.ope.offline_evaluation import (
    ESTIMATORS,
    OPESettings,
    evaluate_lift,
    evaluate_policy_offline,
)

__all__ = [
    "ESTIMATORS",
    "LoggedSteps",
    "OPESettings",
    "evaluate_lift",
    "evaluate_policy_offline",
    "target_log_prob",
]
