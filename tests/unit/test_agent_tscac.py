"""TSCAC (recsys_rl.training.agents.tscac) step by step on a tiny synthetic batch: which stage runs at
each train step, which networks each stage moves, and that every stage-one actor chases its own signal
in its own direction (hate down, the others up).

The expected stage-one losses are recomputed here from the agent's own networks with the closed form
written out (weights softmax(sign * A / lambda_b) * B, capped; loss -mean(w * log pi(a))), the signs
hand-written rather than read from the signal registry.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from feed_batches import AUXILIARY, SIGN, SMALL, batch, moved, stats, values

from recsys_rl import signals
from recsys_rl.training.agents.base import AgentConfig
from recsys_rl.training.agents.factory import build_agent
from recsys_rl.training.agents.tscac import stage_two_log_weights

STAGE_ONE_KEYS = {f"actor/{s}" for s in AUXILIARY}


@pytest.fixture(autouse=True)
def seeded():
    """The networks' initial weights from one seed, whatever ran before in this process."""
    tf.keras.utils.set_random_seed(0)


@pytest.mark.parametrize("algo", ["tscac", "tscac-dpg"])
def test_stage_one_runs_for_exactly_the_first_stage_one_steps_then_stage_two(algo):
    agent = build_agent(algo, stats(), SMALL, stage_one_steps=2)
    logged = batch()
    # steps 0 and 1 are stage one (1 is just inside the boundary), 2 (at it) and 3 are stage two
    for step, stage_one in [(0, True), (1, True), (2, False), (3, False)]:
        main, aux, critic = (
            values(agent.actor),
            [values(a) for a in agent.aux_actors],
            values(agent._critic),
        )
        info = agent.train(logged, **agent.train_kwargs(step))
        actor_keys = {k for k in info.extra if k.startswith("actor/")}
        assert actor_keys == (STAGE_ONE_KEYS if stage_one else {"actor/main"}), f"step {step}"
        assert moved(critic, agent._critic), f"step {step}: the critic learns in both stages"
        assert moved(main, agent.actor) is not stage_one, f"step {step}: main actor"
        for name, before, actor in zip(AUXILIARY, aux, agent.aux_actors, strict=True):
            assert moved(before, actor) is stage_one, f"step {step}: stage-one actor {name}"
    assert int(agent.train_step_counter.numpy()) == 4


def test_zero_stage_one_steps_starts_in_stage_two():
    agent = build_agent("tscac", stats(), SMALL, stage_one_steps=0)
    assert set(agent.train(batch(), **agent.train_kwargs(0)).extra) >= {"actor/main"}
    assert not STAGE_ONE_KEYS & set(agent.train(batch(), **agent.train_kwargs(1)).extra)


def _stage_one_reference(agent, logged):
    """Each stage-one actor's expected loss, given the actors before and the critic after one step."""
    obs, action = logged.time_step.observation, logged.action_step.action
    means = [a.mean_and_std(obs)[0].numpy() for a in agent.aux_actors]
    log_probs = [a(obs)[0].log_prob(action).numpy().astype(np.float64) for a in agent.aux_actors]
    info = agent.train(logged, **agent.train_kwargs(0))
    # the critic steps first, then the actors read it; the actors' step leaves it as it is
    q_logged = agent._critic((obs, action))[0].numpy().astype(np.float64)
    raw = {}
    for name, mean in zip(AUXILIARY, means, strict=True):
        head = signals.FEED_SIGNALS.index(name)
        raw[name] = q_logged[:, head] - agent._critic((obs, mean))[0].numpy()[:, head]
    return info, raw, means, dict(zip(AUXILIARY, log_probs, strict=True))


def _awr_loss(advantage, log_prob, config: AgentConfig) -> float:
    z = advantage / config.behaviour_lambda
    w = np.exp(z - z.max())
    w = np.minimum(w / w.sum() * len(z), config.max_weight)
    return float(-np.mean(w * log_prob))


def test_each_stage_one_actor_is_weighted_towards_its_own_signal_hate_downwards():
    agent = build_agent("tscac", stats(), SMALL, stage_one_steps=1)
    info, raw, _, log_probs = _stage_one_reference(agent, batch())
    for name in AUXILIARY:
        expected = _awr_loss(SIGN[name] * raw[name], log_probs[name], SMALL)
        flipped = _awr_loss(-SIGN[name] * raw[name], log_probs[name], SMALL)
        assert abs(expected - flipped) > 1e-2 * abs(expected), (
            f"{name}: the batch cannot tell the signs apart"
        )
        np.testing.assert_allclose(float(info.extra[f"actor/{name}"]), expected, rtol=1e-4, err_msg=name)
        # what the weights do: the hate actor's weighted logged actions carry less hate than the batch's,
        # every other actor's more of its signal
        z = SIGN[name] * raw[name] / SMALL.behaviour_lambda
        w = np.exp(z - z.max())
        weighted, plain = np.average(raw[name], weights=w), raw[name].mean()
        assert (weighted < plain) if name == "hate" else (weighted > plain), name


def test_each_deterministic_stage_one_actor_climbs_its_own_signal_hate_downwards():
    agent = build_agent("tscac-dpg", stats(), SMALL, stage_one_steps=1)
    logged = batch()
    info, _, means, _ = _stage_one_reference(agent, logged)
    obs, action = logged.time_step.observation, logged.action_step.action.numpy()
    for name, mean in zip(AUXILIARY, means, strict=True):
        q = agent._critic((obs, mean))[0].numpy()[:, signals.FEED_SIGNALS.index(name)].astype(np.float64)

        def loss(sign, q=q, mean=mean):
            value = sign * q
            bc = SMALL.bc_weight * np.mean(np.sum((mean - action) ** 2, axis=-1))
            return -value.mean() / (np.abs(value).mean() + 1e-6) + bc

        assert abs(loss(SIGN[name]) - loss(-SIGN[name])) > 0.1, name
        np.testing.assert_allclose(
            float(info.extra[f"actor/{name}"]), loss(SIGN[name]), rtol=1e-4, err_msg=name
        )


@pytest.mark.parametrize(("algo", "step"), [("tscac", 0), ("tscac", 1), ("tscac-dpg", 0), ("tscac-dpg", 1)])
def test_the_reported_loss_is_the_critics_plus_the_actors_of_the_stage_that_ran(algo, step):
    agent = build_agent(algo, stats(), SMALL, stage_one_steps=1)
    for earlier in range(step):
        agent.train(batch(), **agent.train_kwargs(earlier))
    info = agent.train(batch(), **agent.train_kwargs(step))
    critic = sum(float(info.extra[f"critic/{s}"]) for s in signals.FEED_SIGNALS)
    actors = [float(v) for k, v in info.extra.items() if k.startswith("actor/")]
    assert len(actors) == (len(AUXILIARY) if step == 0 else 1)
    np.testing.assert_allclose(float(info.loss), critic + sum(actors), rtol=1e-5)


def test_stochastic_stage_two_reports_its_largest_weights_share():
    agent = build_agent("tscac", stats(), SMALL, stage_one_steps=0)
    share = float(agent.train(batch(), **agent.train_kwargs(0)).extra["weights/max_share"])
    assert 1.0 / 64 <= share <= 1.0  # the largest weight's share of a batch of 64


def test_deterministic_stage_two_climbs_the_main_head_and_stays_near_the_stage_one_actors():
    """The loss recomputed from the networks as they were: -Q_main(mu) / mean|Q_main| + bc |mu - a|^2
    + closeness * mean over stage-one actors of |mu - mu_i|^2. Freshly initialised actors' means lie
    within about 1e-3 of each other, so the closeness weight is raised until its term shows."""
    config = dataclasses.replace(SMALL, closeness_weight=1e4)
    agent = build_agent("tscac-dpg", stats(), config, stage_one_steps=0)
    logged = batch()
    obs, action = logged.time_step.observation, logged.action_step.action.numpy()
    anchors = np.stack([a.mean_and_std(obs)[0].numpy() for a in agent.aux_actors])
    mean = agent.actor.mean_and_std(obs)[0].numpy()
    info = agent.train(logged, **agent.train_kwargs(0))
    q_main = agent._critic((obs, mean))[0].numpy()[:, signals.FEED_SIGNALS.index("watch_time")]
    closeness = config.closeness_weight * np.mean(np.sum((mean[None] - anchors) ** 2, axis=-1))
    expected = (
        -q_main.mean() / (np.abs(q_main).mean() + 1e-6)
        + config.bc_weight * np.mean(np.sum((mean - action) ** 2, axis=-1))
        + closeness
    )
    assert closeness > 1e-2 * abs(expected)  # large enough for the comparison below to see it
    np.testing.assert_allclose(float(info.extra["actor/main"]), expected, rtol=1e-4)


def test_an_integer_aux_lambda_gives_the_same_stage_two_weights():
    """A YAML config writes ``aux_lambda: 1``: an integer must weigh as 1.0 does."""
    rng = np.random.default_rng(3)
    advantage, behaviour = (
        tf.constant(rng.normal(size=8), tf.float32),
        tf.constant(rng.normal(size=8), tf.float32),
    )
    priors = tf.constant(rng.normal(size=(8, len(AUXILIARY))), tf.float32)
    as_int = stage_two_log_weights(advantage, behaviour, priors, AgentConfig(aux_lambda=1))
    as_float = stage_two_log_weights(advantage, behaviour, priors, AgentConfig(aux_lambda=1.0))
    np.testing.assert_allclose(as_int.numpy(), as_float.numpy())


def test_each_critic_head_bootstraps_from_the_actor_that_optimises_its_signal():
    """DESIGN 3.1: the main head's target uses the main actor's next action, each auxiliary head its own
    stage-one actor's (0 is the main actor, then the stage-one actors in AUXILIARY order)."""
    agent = build_agent("tscac", stats(), SMALL, stage_one_steps=0)
    expected = [0 if s == "watch_time" else 1 + AUXILIARY.index(s) for s in signals.FEED_SIGNALS]
    assert agent._head_policy == expected == [0, 1, 2, 3, 4, 5, 6]


def test_the_agent_counts_its_steps_on_the_counter_it_is_given():
    """The training loop checkpoints its own counter: the agent must step that one, not one of its own."""
    counter = tf.Variable(5, dtype=tf.int64)
    agent = build_agent("tscac", stats(), SMALL, stage_one_steps=0, train_step_counter=counter)
    agent.train(batch(), **agent.train_kwargs(0))
    assert agent.train_step_counter is counter and int(counter.numpy()) == 6


def test_tscacs_critic_takes_the_configured_funnel():
    config = dataclasses.replace(SMALL, funnel=("click", "like", "follow"))
    agent = build_agent("tscac", stats(), config, stage_one_steps=0)
    assert agent._critic._funnel == tuple(signals.FEED_SIGNALS.index(s) for s in ("click", "like", "follow"))
    assert build_agent("tscac", stats(), SMALL, stage_one_steps=0)._critic._funnel == ()
