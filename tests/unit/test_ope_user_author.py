"""Issue 22: the OPE gate on a user_author version re-weights the logged draws of its term's weight.

The logs are a simulated day's feed rows with a user-author term written in by hand: every session but
a few was ranked with one term function, whose weight logit was drawn from N(LOGGED_MEAN, LOGGED_STD);
the follow reward and the request's pair return (its pair rewards' ``author_return``) are made to grow
with the drawn logit, so that the value of another weight distribution is known in closed form.
Candidates are exported-policy manifests with only the term (the gate needs no SavedModel to score a
weight).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest
from transition_shards import feed_table, write_feed_dataset

from recsys_rl import signals
from recsys_rl.config import ConfigError
from recsys_rl.gaussian import log_density
from recsys_rl.ope.evaluate import EvaluateConfig, run_evaluation, scored_policy
from recsys_rl.ope.gate import SUPPORT_HINTS, GateConfig
from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import Simulator
from recsys_rl.training.agents.data import DatasetMismatchError, open_dataset
from recsys_rl.training.agents.policy_io import term_id

LOGGED_MEAN, LOGGED_STD = 0.0, 0.4
FOLLOW_PER_LOGIT = 0.01  # follow reward = 0.02 + FOLLOW_PER_LOGIT * logit, so E[follow] is linear in the mean
RETURN_PER_LOGIT = 0.1  # the request's pair return = 0.5 + RETURN_PER_LOGIT * logit
_FOLLOW = signals.FEED_SIGNALS.index("follow")
_RETURN = signals.PAIR_SIGNALS.index("author_return")


def pair_policy(directory, *, mean: float, std: float = LOGGED_STD, variables: str = "v1", version="ua"):
    """An exported user-author value's manifest (its files are not needed to score the weight)."""
    directory.mkdir(parents=True)
    manifest = {
        "schema_version": 1,
        "kind": "pair_value",
        "surface": "user_author",
        "version": version,
        "reward_std": [1.0, 0.1, 0.01, 0.5],
        "term": {"coefficients": [1.0] * 4, "weight_logit_mean": mean, "weight_logit_std": std},
        "sha256": {"variables/variables.data-00000-of-00001": variables},
    }
    (directory / "policy.json").write_text(json.dumps(manifest))
    return directory


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """(dataset directory, the logged term's id, sessions without it) of one simulated day (of enough
    users that the decisions clear the gate's default minimum effective sample size, 1,000)."""
    day = Simulator(SimConfig(n_users=250), seed=4).run_day(
        behaviour_feed_policy(), behaviour_allocation_policy()
    )
    logged = LoggedSteps.from_day_logs([day])
    rng = np.random.default_rng(0)
    logits = LOGGED_MEAN + LOGGED_STD * rng.standard_normal(logged.rows)
    served = tmp_path_factory.mktemp("served")
    term = term_id(json.loads((pair_policy(served / "p", mean=LOGGED_MEAN) / "policy.json").read_text()))
    no_term = np.isin(logged.session, np.arange(0, logged.sessions, 10))  # every tenth session: none
    rewards = logged.rewards.copy()
    rewards[:, _FOLLOW] = 0.02 + FOLLOW_PER_LOGIT * logits
    pair_rewards = np.zeros((logged.rows, len(signals.PAIR_SIGNALS)))
    pair_rewards[:, _RETURN] = 0.5 + RETURN_PER_LOGIT * logits
    table = feed_table(
        logged,
        user_author_term_id=np.where(no_term, "", term).tolist(),
        user_author_weight_logit=np.where(no_term, 0.0, logits),
        user_author_log_propensity=np.where(
            no_term, 0.0, log_density(logits[:, None], LOGGED_MEAN, np.array([LOGGED_STD]))
        ),
        reward_follow=rewards[:, _FOLLOW],
        pair_reward=pair_rewards,
    )
    directory = tmp_path_factory.mktemp("logs")
    write_feed_dataset(directory, table, user_author=True)
    return directory, term, int(np.unique(logged.session[no_term]).size)


def test_the_term_steps_are_the_logged_weight_draws_of_sessions_ranked_with_that_term(logs, tmp_path):
    directory, term, sessions_without = logs
    steps = LoggedSteps.from_dataset(open_dataset(directory), term)
    assert steps.excluded["user_author_term"]["sessions"] == sessions_without
    assert steps.actions.shape == (steps.rows, 1) and steps.actions.dtype == np.float32  # as feed actions
    # each row's behaviour log-probability is its logged logit's density under the served Gaussian
    expected = log_density(steps.actions.astype(np.float64), LOGGED_MEAN, np.array([LOGGED_STD]))
    np.testing.assert_allclose(steps.behaviour_log_prob, expected, atol=1e-5)
    # re-weighted to a candidate with a higher mean, the follow value moves as the closed form says
    candidate = scored_policy(pair_policy(tmp_path / "c", mean=0.3), "user_author")
    ratio = np.exp(candidate.log_prob(steps.states, steps.actions) - steps.behaviour_log_prob)
    estimate = np.sum(ratio * steps.rewards[:, _FOLLOW]) / np.sum(ratio)
    assert estimate == pytest.approx(0.02 + FOLLOW_PER_LOGIT * 0.3, abs=0.0006)
    assert np.mean(steps.rewards[:, _FOLLOW]) == pytest.approx(
        0.02 + FOLLOW_PER_LOGIT * LOGGED_MEAN, abs=0.0004
    )


def test_the_pairs_return_is_read_from_the_request_rows_pair_rewards_and_reweighted(logs, tmp_path):
    directory, term, _ = logs
    steps = LoggedSteps.from_dataset(open_dataset(directory), term, ("author_return",))
    assert steps.signals == (*signals.FEED_SIGNALS, "author_return")
    candidate = scored_policy(pair_policy(tmp_path / "c", mean=-0.3), "user_author")
    ratio = np.exp(candidate.log_prob(steps.states, steps.actions) - steps.behaviour_log_prob)
    estimate = np.sum(ratio * steps.rewards[:, -1]) / np.sum(ratio)
    assert estimate == pytest.approx(0.5 - RETURN_PER_LOGIT * 0.3, abs=0.005)
    # the feed's own rewards are where they were
    feed = LoggedSteps.from_dataset(open_dataset(directory), term)
    np.testing.assert_array_equal(steps.rewards[:, :-1], feed.rewards)


def test_the_gate_refuses_a_term_that_costs_the_pairs_return_naming_it(logs, tmp_path):
    """A candidate whose weight is lower than the served one loses pair returns (and follows) in these
    logs; the gate judges author_return as a constraint signal and says so."""
    directory, _, _ = logs
    gate = GateConfig(surface="user_author", resamples=50)
    assert gate.constraint_signals[-1] == "author_return" and gate.main_signal == "watch_time"
    candidate = pair_policy(tmp_path / "lower", mean=LOGGED_MEAN - 0.4, version="lower")
    report = run_evaluation(
        EvaluateConfig(candidate=str(candidate), data=str(directory), out=str(tmp_path / "o"), gate=gate)
    ).report
    lift = report["lift"]["estimators"]["snips"]["overall"]["author_return"]["relative"]
    assert lift["value"] == pytest.approx(-RETURN_PER_LOGIT * 0.4 / 0.5, abs=0.02)
    assert any(
        r.startswith("author_return: 95% lower bound of the lift") for r in report["verdict"]["reasons"]
    )


def test_a_user_author_gate_refuses_logs_whose_request_rows_cannot_say_the_pairs_return(logs, tmp_path):
    directory, _, _ = logs
    table = feed_table(LoggedSteps.from_dataset(open_dataset(directory)))
    candidate = str(pair_policy(tmp_path / "c", mean=LOGGED_MEAN))
    gate = GateConfig(surface="user_author", resamples=20)

    def evaluate(data) -> None:
        run_evaluation(
            EvaluateConfig(candidate=candidate, data=str(data), out=str(tmp_path / "o"), gate=gate)
        )

    without = tmp_path / "without-pairs"
    without.mkdir()
    write_feed_dataset(without, table)
    with pytest.raises(DatasetMismatchError, match="built without the user-author surface, so its request"):
        evaluate(without)
    old = tmp_path / "schema-5"
    old.mkdir()
    write_feed_dataset(
        old,
        feed_table(LoggedSteps.from_dataset(open_dataset(directory)), schema_version=5),
        schema_version=5,
        user_author=True,
    )
    with pytest.raises(
        DatasetMismatchError, match="schema_version 5, whose request rows have no pair rewards"
    ):
        evaluate(old)
    shard = old / "transitions-feed-00000-of-00002.parquet"
    with pytest.raises(
        ValueError,
        match=rf"{re.escape(str(shard))} has no column 'pair_reward': .*\(a request row's pair_reward came "
        r"in dataset schema 6\); rebuild the dataset$",
    ):
        LoggedSteps.from_parquet([shard], signals.FEED_SIGNALS, None, ("author_return",))


def test_logs_without_the_term_have_no_session_to_weight_and_say_why(logs, tmp_path):
    directory, term, _ = logs
    with pytest.raises(ValueError, match="without the evaluated user-author term function"):
        LoggedSteps.from_dataset(open_dataset(directory), "another-term")
    # a dataset from before the term's columns (schema 3) had no term anywhere
    old = tmp_path / "schema-3"
    old.mkdir()
    feed_steps = LoggedSteps.from_dataset(open_dataset(directory))
    write_feed_dataset(old, feed_table(feed_steps, schema_version=3), schema_version=3)
    shard = re.escape(str(old / "transitions-feed-00000-of-00002.parquet"))
    with pytest.raises(
        ValueError,
        match=rf"every session in the Parquet shards \[.*{shard}.*without the evaluated user-author term "
        r"function.*; nothing is left to weight \(log with a server that explores: serve without "
        r"--no-explore; and, for a user-author term, with that term serving: a new term has no logs "
        r"until it serves, so approve its first exposure, registry approve-exposure\)",
    ):
        LoggedSteps.from_dataset(open_dataset(old), term)
    empty = tmp_path / "empty.parquet"
    pq.write_table(feed_table(feed_steps).slice(0, 0), empty)
    with pytest.raises(ValueError, match=rf"the Parquet shards \['{re.escape(str(empty))}'\] hold no rows"):
        LoggedSteps.from_parquet([empty], signals.FEED_SIGNALS, term)
    assert LoggedSteps.from_dataset(open_dataset(old)).rows > 0  # and reads as before for the feed


def test_the_gate_judges_the_weights_support_and_names_the_term_settings_that_move_it(logs, tmp_path):
    """The served weight is covered by its own logs; one three logged stds away is not, and the reason
    names the user-author settings. (The rewards do not depend on the weight here but for follows, so
    the lift rules are not what this is about.)"""
    directory, _, _ = logs
    gate = GateConfig(surface="user_author", resamples=50)

    def reasons(name: str, mean: float) -> tuple[str, ...]:
        candidate = pair_policy(tmp_path / name, mean=mean, version=name)
        out = tmp_path / f"out-{name}"
        report = run_evaluation(
            EvaluateConfig(candidate=str(candidate), data=str(directory), out=str(out), gate=gate)
        ).report
        assert report["actions"]["names"] == ["user_author_weight_logit"]
        assert report["lift"]["excluded"]["user_author_term"]["sessions"] > 0
        return tuple(report["verdict"]["reasons"])

    assert not [
        r for r in reasons("same", LOGGED_MEAN) if "effective sample size" in r or "weight share" in r
    ]
    far = reasons("far", LOGGED_MEAN + 3.0)
    assert any(r.startswith("candidate, decision level: effective sample size") for r in far), far
    assert SUPPORT_HINTS["user_author"] in far


def test_policies_of_two_term_functions_or_of_the_feed_are_refused_naming_why(logs, tmp_path):
    directory, _, _ = logs
    gate = GateConfig(surface="user_author", resamples=20)
    one = pair_policy(tmp_path / "one", mean=0.0)
    other = pair_policy(tmp_path / "other", mean=0.0, variables="retrained")
    with pytest.raises(ConfigError, match="different user-author terms"):
        run_evaluation(
            EvaluateConfig(
                candidate=str(one),
                incumbent=str(other),
                data=str(directory),
                out=str(tmp_path / "o"),
                gate=gate,
            )
        )
    with pytest.raises(ConfigError, match=r"holds a user_author policy, but gate\.surface is feed"):
        scored_policy(one, "feed")
