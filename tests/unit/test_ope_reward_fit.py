"""The reward model's out-of-fold fit, as the report shows it beside DM and DR."""

import numpy as np
import pytest

from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.ope.offline_evaluation import evaluate_lift, reward_model_fit
from recsys_rl.ope.reward_model import QPredictions


def _logged(rewards: np.ndarray) -> LoggedSteps:
    n = rewards.shape[0]
    return LoggedSteps(
        states=np.zeros((n, 1), np.float32),
        actions=np.zeros((n, 1), np.float32),
        rewards=rewards,
        behaviour_log_prob=np.zeros(n),
        groups=np.zeros(n, np.int64),
        session=np.arange(n),
        step=np.zeros(n, np.int64),
        done=np.ones(n, bool),
        next_states=np.zeros((n, 1), np.float32),
        signals=("watch_time", "click"),
    )


def test_fit_by_hand():
    logged = _logged(np.array([[1.0, 5.0], [2.0, 5.0], [3.0, 5.0]]))
    q = np.array([[1.0, 5.0], [2.0, 5.0], [4.0, 5.0]])
    fit = reward_model_fit(logged, QPredictions(q, q, np.zeros(3, int), np.zeros((1, 1, 2))))
    # watch time: SSE 1, SST 2; clicks are constant, so R^2 is undefined (null), the RMSE 0
    assert fit["signals"]["watch_time"] == pytest.approx(
        {"r2": 0.5, "rmse": np.sqrt(1 / 3), "mean_reward": 2.0}
    )
    assert fit["signals"]["click"] == {"r2": None, "rmse": 0.0, "mean_reward": 5.0}
    assert fit["out_of_fold"] is True


class _Policy:
    def log_prob(self, states, actions):
        return np.zeros(states.shape[0])

    def act(self, states, rng):
        return np.zeros((states.shape[0], 1)), np.zeros(states.shape[0])


def test_a_lift_reports_the_fit_only_when_a_reward_model_was_fitted():
    rng = np.random.default_rng(0)
    logged = _logged(rng.normal(size=(60, 2)))
    with_model = evaluate_lift(logged, _Policy(), estimators=("dr",), resamples=20, groups=False)
    without = evaluate_lift(logged, _Policy(), estimators=("ips",), resamples=20, groups=False)
    assert set(with_model["reward_model_fit"]["signals"]) == {"watch_time", "click"}
    assert without["reward_model_fit"] is None
