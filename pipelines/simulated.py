"""Simulated logs turned into a transition dataset the production way: simulator -> Kafka -> pipeline.

Benchmarks, tests and the demo all need a dataset whose world they can later run policies in; building
it through the real broker and the real Beam pipeline (never a shortcut from the simulator's arrays)
means what they measure is what production would train on.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

from recsys_rl.pipelines.build_transitions import BuildResult, BuildTransitionsConfig, build_transitions
from recsys_rl.sim.simulate import SimulateConfig, run_simulation


def simulated_dataset(
    bootstrap_servers: str,
    out: str | Path,
    *,
    users: int,
    days: int = 1,
    seed: int = 0,
    pipeline_args: Sequence[str] = (),
    user_author_surface: bool = False,
) -> BuildResult:
    """Simulate ``users`` for ``days`` into fresh topics on the broker and build one dataset under ``out``.

    The world is fixed by (users, seed): simulator evaluations of policies trained on the dataset must
    use the same two.
    """
    suffix = uuid.uuid4().hex[:8]
    sim = SimulateConfig(
        users=users,
        days=days,
        seed=seed,
        decisions_topic=f"sim-dec-{suffix}",
        feedback_topic=f"sim-fb-{suffix}",
    )
    run_simulation(sim, bootstrap_servers)
    result = build_transitions(
        BuildTransitionsConfig(
            bootstrap_servers=bootstrap_servers,
            group=f"sim-{suffix}",
            out=str(out),
            decisions_topic=sim.decisions_topic,
            feedback_topic=sim.feedback_topic,
            dead_letter_topic="",
            start="earliest",
            commit=False,
            user_author_surface=user_author_surface,
        ),
        pipeline_args,
    )
    if result.dataset_dir is None:
        raise RuntimeError(f"the simulation of {users} users wrote no records to {bootstrap_servers}")
    return result
