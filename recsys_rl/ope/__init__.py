"""Offline policy evaluation (DESIGN 8): estimators, intervals and diagnostics on logged decisions.

``LoggedSteps`` holds the logs; ``evaluate_policy_offline`` and ``evaluate_lift`` are the entry points and
document the result dicts that the rollout gate and the report read.
"""

from recsys_rl.ope.evaluate import ESTIMATORS, OPESettings, evaluate_lift, evaluate_policy_offline
from recsys_rl.ope.logged import LoggedSteps, target_log_prob

__all__ = [
    "ESTIMATORS",
    "LoggedSteps",
    "OPESettings",
    "evaluate_lift",
    "evaluate_policy_offline",
    "target_log_prob",
]
