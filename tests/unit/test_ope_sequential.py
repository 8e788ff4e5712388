"""Sequential estimators by hand on two sessions, and FQE on a chain whose value is known."""

import dataclasses
import math

import numpy as np
import pytest

from recsys_rl.ope import sequential as seq
from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.ope.reward_model import QPredictions

GAMMAS = np.array([0.5, 0.9])


def _steps(
    session: list[int],
    rewards: np.ndarray,
    states: np.ndarray | None = None,
    actions: np.ndarray | None = None,
) -> LoggedSteps:
    session_array = np.asarray(session)
    n = session_array.size
    starts = np.flatnonzero(np.r_[True, session_array[1:] != session_array[:-1]])
    step = np.arange(n) - starts[session_array]
    done = np.r_[session_array[1:] != session_array[:-1], True]
    states = np.zeros((n, 2), np.float32) if states is None else states
    next_states = np.where(done[:, None], 0.0, np.roll(states, -1, axis=0)).astype(np.float32)
    return LoggedSteps(
        states=states,
        actions=np.zeros((n, 1), np.float32) if actions is None else actions,
        rewards=np.asarray(rewards, np.float64),
        behaviour_log_prob=np.zeros(n),
        groups=np.zeros(n, np.int64),
        session=session_array,
        step=step,
        done=done,
        next_states=next_states,
        signals=tuple(f"signal_{i}" for i in range(np.shape(rewards)[1])),
    )


# session 0 has two decisions (weights 2 then 0.5), session 1 one (weight 4)
LOGGED = _steps([0, 0, 1], np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
LOG_RATIO = np.log([2.0, 0.5, 4.0])


def test_cumulative_log_ratio_restarts_each_session():
    np.testing.assert_allclose(seq.cumulative_log_ratio(LOGGED, LOG_RATIO), [math.log(2), 0.0, math.log(4)])


def test_cumulative_log_ratio_restarts_sessions_that_start_below_one_and_floors_a_zero_density():
    logged = _steps([0, 0, 1, 1, 2], np.zeros((5, 1)))
    log_ratio = np.array([np.log(0.25), np.log(2.0), -np.inf, np.log(3.0), np.log(0.5)])  # -inf: density 0
    cumulative = seq.cumulative_log_ratio(logged, log_ratio)
    np.testing.assert_allclose(cumulative[[0, 1, 4]], np.log([0.25, 0.5, 0.5]))
    assert np.all(np.isfinite(cumulative)) and np.all(cumulative[2:4] <= -seq.MAX_LOG_WEIGHT)
    np.testing.assert_array_equal(seq.importance_weights(cumulative)[2:4], [0.0, 0.0])


def test_session_log_ratio_is_the_log_product_over_each_whole_session():
    logged = _steps([0, 0, 0, 1, 2, 2], np.zeros((6, 1)))
    log_ratio = np.log([2.0, 0.5, 3.0, 0.25, 4.0, 4.0])
    np.testing.assert_allclose(seq.session_log_ratio(logged, log_ratio), np.log([3.0, 0.25, 16.0]))


def test_pdis_by_hand():
    # rho = [2, 1 | 4]; session 0: 2*1 + 0.5*1*3 = 3.5 and 2*2 + 0.9*1*4 = 7.6; session 1: 4*5, 4*6
    np.testing.assert_allclose(seq.pdis(LOGGED, LOG_RATIO, GAMMAS).value(), [(3.5 + 20) / 2, (7.6 + 24) / 2])


def test_wpdis_by_hand():
    # t = 0: (2*1 + 4*5) / (2 + 4) and (2*2 + 4*6) / 6
    # t = 1: only session 0 is running (rho 1): 0.5*3 and 0.9*4, over 1 + 4 (session 1 stays with rho 4)
    expected = [22 / 6 + 1.5 / 5, 28 / 6 + 3.6 / 5]
    np.testing.assert_allclose(seq.wpdis(LOGGED, LOG_RATIO, GAMMAS).value(), expected)


def test_sequential_dr_and_fqe_by_hand():
    q = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    v = np.array([[2.0, 2.0], [1.0, 1.0], [4.0, 4.0]])
    model = QPredictions(q, v, np.zeros(3, int), np.zeros((1, 1, 2)))
    # session 0, t = 0: rho 2, previous 1:   2 (1 - 1) + 2 = 2         and 2 (2 - 1) + 2 = 4
    #            t = 1: rho 1, previous 2:   0.5 (1 (3 - 2) + 2 * 1)  and 0.9 (1 (4 - 2) + 2 * 1)
    # session 1, t = 0: rho 4, previous 1:   4 (5 - 3) + 4 = 12        and 4 (6 - 3) + 4 = 16
    session0 = [2 + 0.5 * 3, 4 + 0.9 * 4]
    expected = [(session0[0] + 12) / 2, (session0[1] + 16) / 2]
    np.testing.assert_allclose(seq.sequential_dr(LOGGED, LOG_RATIO, GAMMAS, model).value(), expected)
    # FQE: v at each session's first decision
    np.testing.assert_allclose(seq.fqe(LOGGED, model).value(), [3.0, 3.0])


def test_sequential_dr_starts_each_session_with_a_previous_weight_of_one():
    """Session 0 ends with rho 4, so a session start that took the previous row's rho would see it."""
    q = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    v = np.array([[2.0, 2.0], [1.0, 1.0], [4.0, 4.0]])
    model = QPredictions(q, v, np.zeros(3, int), np.zeros((1, 1, 2)))
    log_ratio = np.log([2.0, 2.0, 4.0])
    # session 0, t = 0: rho 2, previous 1: 2 (1 - 1) + 2 = 2 and 2 (2 - 1) + 2 = 4
    #            t = 1: rho 4, previous 2: 0.5 (4 (3 - 2) + 2 * 1) = 3 and 0.9 (4 (4 - 2) + 2 * 1) = 9
    # session 1, t = 0: rho 4, previous 1: 4 (5 - 3) + 4 = 12 and 4 (6 - 3) + 4 = 16
    expected = [(2 + 3 + 12) / 2, (4 + 9 + 16) / 2]
    np.testing.assert_allclose(seq.sequential_dr(LOGGED, log_ratio, GAMMAS, model).value(), expected)


def test_on_policy_importance_estimators_are_the_mean_discounted_return():
    # session 0: 1 + 0.5 * 3 and 2 + 0.9 * 4; session 1: 5 and 6
    expected = [(2.5 + 5) / 2, (5.6 + 6) / 2]
    zero = np.zeros(3)
    np.testing.assert_allclose(seq.on_policy_return(LOGGED, GAMMAS).value(), expected)
    np.testing.assert_allclose(seq.pdis(LOGGED, zero, GAMMAS).value(), expected)
    np.testing.assert_allclose(seq.wpdis(LOGGED, zero, GAMMAS).value(), expected)


def test_estimators_return_one_row_per_session():
    for terms in (seq.pdis(LOGGED, LOG_RATIO, GAMMAS), seq.wpdis(LOGGED, LOG_RATIO, GAMMAS)):
        assert terms.numerator.shape[0] == LOGGED.sessions


@dataclasses.dataclass(frozen=True)
class Constant:
    """A deterministic target that always plays ``value``."""

    value: float

    def log_prob(self, states, actions):
        return np.zeros(states.shape[0])

    def act(self, states, rng):
        return np.full((states.shape[0], 1), self.value), np.zeros(states.shape[0])


def test_fqe_recovers_the_discounted_value_of_a_chain():
    # 300 sessions of 3 decisions; state = one-hot of the step; reward = action (signal 0), 2 x action
    # (signal 1). Playing 1 forever is worth 1 + g + g^2 per unit of reward.
    sessions, length = 300, 3
    session = np.repeat(np.arange(sessions), length)
    states = np.tile(np.eye(length, dtype=np.float32), (sessions, 1))
    actions = np.random.default_rng(0).normal(size=(sessions * length, 1)).astype(np.float32)
    logged = _steps(session.tolist(), np.column_stack([actions[:, 0], 2 * actions[:, 0]]), states, actions)
    target = Constant(1.0)
    expected = [1 + 0.5 + 0.25, 2 * (1 + 0.9 + 0.81)]
    model = seq.fit_fqe(logged, target, gammas=GAMMAS, iterations=5, folds=2, ridge=1e-9, samples=1)
    np.testing.assert_allclose(seq.fqe(logged, model).value(), expected, rtol=1e-4)
    # Q at the logged action: a + g V(next step)
    next_value = np.array([[0.5 * 1.5, 0.9 * 2 * 1.9], [0.5 * 1.0, 0.9 * 2.0], [0.0, 0.0]])
    expected_q = np.column_stack([actions[:, 0], 2 * actions[:, 0]]) + np.tile(next_value, (sessions, 1))
    np.testing.assert_allclose(model.q_logged, expected_q, atol=1e-3)
    # without iterations FQE is the one-step reward model: the chain's first reward only
    one_step = seq.fit_fqe(logged, target, gammas=GAMMAS, iterations=0, folds=2, ridge=1e-9, samples=1)
    np.testing.assert_allclose(seq.fqe(logged, one_step).value(), [1.0, 2.0], rtol=1e-4)


@pytest.mark.parametrize("iterations", [1, 2])
def test_each_fqe_iteration_adds_one_step_of_horizon(iterations):
    sessions, length = 200, 3
    session = np.repeat(np.arange(sessions), length)
    states = np.tile(np.eye(length, dtype=np.float32), (sessions, 1))
    actions = np.random.default_rng(1).normal(size=(sessions * length, 1)).astype(np.float32)
    logged = _steps(session.tolist(), np.column_stack([actions[:, 0], actions[:, 0]]), states, actions)
    model = seq.fit_fqe(logged, Constant(1.0), gammas=GAMMAS, iterations=iterations, folds=2, ridge=1e-9)
    expected = [sum(g**k for k in range(iterations + 1)) for g in GAMMAS]
    np.testing.assert_allclose(seq.fqe(logged, model).value(), expected, rtol=1e-4)


def test_fqe_knows_how_much_of_a_fixed_length_session_is_left_when_the_state_does_not_say():
    # 400 sessions of 6 decisions whose state carries no position: Q must take the step as an input, or it
    # averages the rest-of-session value over positions (the review measured 9.5% off on such logs)
    sessions, length = 400, 6
    session = np.repeat(np.arange(sessions), length)
    actions = np.random.default_rng(2).normal(size=(sessions * length, 1)).astype(np.float32)
    logged = _steps(session.tolist(), np.column_stack([actions[:, 0], actions[:, 0]]), actions=actions)
    model = seq.fit_fqe(logged, Constant(1.0), gammas=GAMMAS, iterations=10, folds=2, ridge=1e-9, samples=1)
    expected = [sum(g**k for k in range(length)) for g in GAMMAS]
    np.testing.assert_allclose(seq.fqe(logged, model).value(), expected, rtol=1e-3)
