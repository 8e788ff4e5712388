"""The actor and critic networks: state normalisation inside the model, the std's range, and the funnel.

The progressive critic's promise is one-way: a later head reads the earlier heads' values but its TD
error never reaches their weights. Both halves are checked, on an untrained network, with the gradient
and with a perturbation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from recsys_rl import signals
from recsys_rl.fusion import FEED_ACTION_NAMES
from recsys_rl.state import FEED_STATE_FEATURES
from recsys_rl.training.agents.base import AgentConfig
from recsys_rl.training.agents.data import statistics_of
from recsys_rl.training.agents.networks import (
    LOG_STD_RANGE,
    GaussianActorNetwork,
    MultiTaskCriticNetwork,
    _LoggedActionFit,
)
from recsys_rl.training.agents.specs import feed_action_spec, feed_observation_spec

STATE_SIZE = len(FEED_STATE_FEATURES)
ACTION_SIZE = len(FEED_ACTION_NAMES)
STATE_MEAN = np.linspace(-50.0, 300.0, STATE_SIZE)  # far from zero, as raw logged features are
STATE_STD = np.linspace(0.5, 40.0, STATE_SIZE)
INITIAL_MEAN = np.linspace(-1.0, 1.0, ACTION_SIZE)


@pytest.fixture(autouse=True)
def _seeded() -> None:
    tf.keras.utils.set_random_seed(1234)


def _actor(**overrides) -> GaussianActorNetwork:
    settings = dict(
        state_mean=STATE_MEAN,
        state_std=STATE_STD,
        initial_mean=INITIAL_MEAN,
        initial_std=0.3,
        hidden=(16, 16),
    )
    settings.update(overrides)
    actor = GaussianActorNetwork(feed_observation_spec(), feed_action_spec(), **settings)
    actor.create_variables()
    return actor


NO_LOGGED_ACTION_FIT = np.zeros((STATE_SIZE + 1, ACTION_SIZE))


def _critic(
    funnel=(), mean=STATE_MEAN, std=STATE_STD, shared_trunk=False, logged_action_coef=NO_LOGGED_ACTION_FIT
) -> MultiTaskCriticNetwork:
    critic = MultiTaskCriticNetwork(
        (feed_observation_spec(), feed_action_spec()),
        signals.FEED_SIGNALS,
        state_mean=mean,
        state_std=std,
        logged_action_coef=logged_action_coef,
        hidden=(16, 16),
        head_hidden=8,
        funnel=funnel,
        shared_trunk=shared_trunk,
    )
    critic.create_variables()
    return critic


def _states(rng: np.random.Generator, batch: int) -> tf.Tensor:
    return tf.constant(STATE_MEAN + STATE_STD * rng.normal(size=(batch, STATE_SIZE)), tf.float32)


def _actions(rng: np.random.Generator, batch: int) -> tf.Tensor:
    return tf.constant(rng.normal(size=(batch, ACTION_SIZE)), tf.float32)


def _randomise(network, seed: int) -> None:
    """Weights of order one everywhere, biases included: an untrained network's zero biases and tiny
    output kernel would hide a wrong sign or a missing activation."""
    rng = np.random.default_rng(seed)
    for variable in network.trainable_variables:
        variable.assign(rng.normal(0.0, 0.5, variable.shape).astype(np.float32))


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def _dense(layer, x: np.ndarray) -> np.ndarray:
    return x @ layer.kernel.numpy().astype(np.float64) + layer.bias.numpy()


def _head_variables(critic: MultiTaskCriticNetwork, name: str, *, hidden: bool = True) -> list[tf.Variable]:
    """A head's output layer, and its hidden layer unless ``hidden`` is false."""
    scopes = (f"/head_{name}/", f"/head_{name}_hidden/") if hidden else (f"/head_{name}/",)
    return [v for v in critic.trainable_variables if any(scope in v.name for scope in scopes)]


# -- actor ----------------------------------------------------------------------------------------


def test_untrained_actor_at_the_mean_state_proposes_the_initial_mean():
    actor = _actor()
    states = tf.constant(np.stack([STATE_MEAN, STATE_MEAN]), tf.float32)
    mean, std = actor.mean_and_std(states)
    np.testing.assert_allclose(mean.numpy(), np.stack([INITIAL_MEAN] * 2), atol=1e-5)
    np.testing.assert_allclose(std.numpy(), np.full((2, ACTION_SIZE), 0.3), rtol=1e-5)


def test_actor_normalises_raw_states_with_the_given_moments():
    """The same weights on (s - mean) / std without normalisation give the same action as on raw s."""
    normalising = _actor()
    plain = _actor(state_mean=np.zeros(STATE_SIZE), state_std=np.ones(STATE_SIZE))
    rng = np.random.default_rng(3)
    for variable in normalising.trainable_variables:  # large weights, so the input visibly matters
        variable.assign(rng.normal(size=variable.shape).astype(np.float32))
    for source, target in zip(normalising.trainable_variables, plain.trainable_variables, strict=True):
        target.assign(source)
    states = _states(rng, 5)

    raw_mean, _ = normalising.mean_and_std(states)
    by_hand, _ = plain.mean_and_std((states - STATE_MEAN.astype(np.float32)) / STATE_STD.astype(np.float32))
    unnormalised, _ = plain.mean_and_std(states)

    np.testing.assert_allclose(raw_mean.numpy(), by_hand.numpy(), rtol=1e-4, atol=1e-4)
    assert np.abs(raw_mean.numpy() - unnormalised.numpy()).max() > 1.0


def test_the_actors_mean_is_a_relu_network_of_the_normalised_state_by_hand():
    actor = _actor()
    _randomise(actor, 11)
    states = _states(np.random.default_rng(12), 16)
    x = (states.numpy().astype(np.float64) - STATE_MEAN) / STATE_STD
    for layer in actor._hidden:
        x = _relu(_dense(layer, x))
    mean, _ = actor.mean_and_std(states)
    np.testing.assert_allclose(mean.numpy(), _dense(actor._mean, x), rtol=1e-4, atol=1e-4)


def test_actor_distribution_has_the_actors_mean_and_std():
    actor = _actor(initial_std=0.5)
    states = _states(np.random.default_rng(0), 4)
    dist, _ = actor(states)
    mean, std = actor.mean_and_std(states)
    assert dist.mean().shape == (4, ACTION_SIZE)
    np.testing.assert_allclose(dist.mean().numpy(), mean.numpy())
    np.testing.assert_allclose(dist.stddev().numpy(), std.numpy(), rtol=1e-6)
    np.testing.assert_allclose(std.numpy(), 0.5, rtol=1e-6)


@pytest.mark.parametrize("learn_std", [True, False])
def test_learn_std_decides_whether_log_std_is_trained(learn_std):
    actor = _actor(learn_std=learn_std)
    trainable = [v.name for v in actor.trainable_variables]
    assert any("log_std" in name for name in trainable) is learn_std
    assert any("log_std" in v.name for v in actor.variables)  # saved either way: serving needs it
    assert not any(name.split("/")[-1] in ("mean:0", "std:0") for name in trainable)


def test_fixed_std_gets_no_gradient_but_a_learned_one_does():
    states = _states(np.random.default_rng(1), 8)
    actions = tf.zeros([8, ACTION_SIZE])
    for learn_std in (True, False):
        actor = _actor(learn_std=learn_std)
        with tf.GradientTape() as tape:
            dist, _ = actor(states)
            loss = -tf.reduce_mean(dist.log_prob(actions))
        grads = tape.gradient(loss, actor.trainable_variables)
        by_name = {v.name: g for v, g in zip(actor.trainable_variables, grads, strict=True)}
        assert all(g is not None for g in by_name.values())
        assert any("log_std" in name for name in by_name) is learn_std


@pytest.mark.parametrize(
    ("initial_std", "expected"),
    [
        pytest.param(math.exp(3.0), math.exp(LOG_STD_RANGE[1]), id="above"),
        pytest.param(math.exp(-10.0), math.exp(LOG_STD_RANGE[0]), id="below"),
        pytest.param(0.3, 0.3, id="inside"),
    ],
)
def test_actor_std_is_clipped_to_the_log_std_range(initial_std, expected):
    assert LOG_STD_RANGE == (-5.0, 1.0)
    actor = _actor(initial_std=initial_std)
    _, std = actor.mean_and_std(_states(np.random.default_rng(2), 3))
    np.testing.assert_allclose(std.numpy(), np.full((3, ACTION_SIZE), expected), rtol=1e-5)


def test_a_learned_log_std_pushed_out_of_range_is_clipped():
    actor = _actor(learn_std=True)
    (log_std,) = [v for v in actor.trainable_variables if "log_std" in v.name]
    log_std.assign(np.linspace(-9.0, 4.0, ACTION_SIZE).astype(np.float32))
    _, std = actor.mean_and_std(_states(np.random.default_rng(2), 1))
    expected = np.exp(np.clip(np.linspace(-9.0, 4.0, ACTION_SIZE), *LOG_STD_RANGE))
    np.testing.assert_allclose(std.numpy()[0], expected, rtol=1e-5)


# -- critic ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("funnel", [(), ("click", "like", "follow")], ids=["plain", "funnel"])
def test_critic_returns_one_value_per_signal(funnel):
    critic = _critic(funnel)
    rng = np.random.default_rng(4)
    q, _ = critic((_states(rng, 5), _actions(rng, 5)))
    assert q.shape == (5, len(signals.FEED_SIGNALS))
    assert critic.signal_names == signals.FEED_SIGNALS
    assert np.all(np.isfinite(q.numpy()))


def test_critic_normalises_states_inside_the_network():
    normalising = _critic()
    plain = _critic(mean=np.zeros(STATE_SIZE), std=np.ones(STATE_SIZE))
    for source, target in zip(normalising.trainable_variables, plain.trainable_variables, strict=True):
        target.assign(source)
    rng = np.random.default_rng(5)
    states, actions = _states(rng, 4), _actions(rng, 4)
    q, _ = normalising((states, actions))
    by_hand, _ = plain(((states - STATE_MEAN.astype(np.float32)) / STATE_STD.astype(np.float32), actions))
    np.testing.assert_allclose(q.numpy(), by_hand.numpy(), rtol=1e-4, atol=1e-5)


def test_critic_reads_an_action_as_its_departure_from_the_logged_action_fit():
    coef = np.random.default_rng(8).normal(size=(STATE_SIZE + 1, ACTION_SIZE))
    fitted, plain = _critic(logged_action_coef=coef), _critic()
    for source, target in zip(fitted.trainable_variables, plain.trainable_variables, strict=True):
        target.assign(source)
    rng = np.random.default_rng(9)
    states, actions = _states(rng, 4), _actions(rng, 4)
    q, _ = fitted((states, actions))
    normalised = (states.numpy() - STATE_MEAN) / STATE_STD
    departure = actions.numpy() - coef[0] - normalised @ coef[1:]
    by_hand, _ = plain((states, departure.astype(np.float32)))
    np.testing.assert_allclose(q.numpy(), by_hand.numpy(), rtol=1e-4, atol=1e-4)


def test_statistics_fit_the_logged_actions_on_the_normalised_state():
    rng = np.random.default_rng(10)
    states = rng.normal(3.0, 2.0, (500, STATE_SIZE))
    intercept, slopes = rng.normal(size=ACTION_SIZE), rng.normal(size=(STATE_SIZE, ACTION_SIZE))
    actions = intercept + states @ slopes  # a logging policy whose mean is linear in the state, no noise
    stats = statistics_of(states, np.zeros((500, 1)), actions)
    normalised = (states - stats.state_mean) / stats.state_std
    np.testing.assert_allclose(
        stats.logged_action_coef[0] + normalised @ stats.logged_action_coef[1:], actions, atol=1e-9
    )
    assert statistics_of(states, np.zeros((500, 1)), actions[:, :0]).logged_action_coef.shape == (
        STATE_SIZE + 1,
        0,
    )


def _action_slope_learnt(logged_action_coef: np.ndarray, states, actions, rewards) -> float:
    """A one-head critic regressed on (state, action) -> reward for 300 seeded Adam steps; the mean slope
    of its value in the click logit."""
    critic = MultiTaskCriticNetwork(
        (feed_observation_spec(), feed_action_spec()),
        ("click",),
        state_mean=np.zeros(STATE_SIZE),
        state_std=np.ones(STATE_SIZE),
        logged_action_coef=logged_action_coef,
        hidden=(32, 32),
        head_hidden=16,
    )
    critic.create_variables()
    optimizer = tf.keras.optimizers.Adam(1e-3)
    states, actions, rewards = (tf.constant(x, tf.float32) for x in (states, actions, rewards))
    picks = np.random.default_rng(11).integers(0, len(rewards), (300, 256))
    for rows in picks:
        with tf.GradientTape() as tape:
            q, _ = critic((tf.gather(states, rows), tf.gather(actions, rows)))
            loss = tf.reduce_mean((q[:, 0] - tf.gather(rewards, rows)) ** 2)
        variables = critic.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
    step = np.zeros(ACTION_SIZE, np.float32)
    step[FEED_ACTION_NAMES.index("click")] = 0.25
    up, _ = critic((states, actions + step))
    down, _ = critic((states, actions - step))
    return float(tf.reduce_mean(up - down)) / 0.5


def test_a_state_driven_logging_policy_does_not_lend_the_states_effect_to_the_action():
    """The logged click logit follows a state feature that drives the reward far more than the click
    logit does (slope 0.1): given raw actions a critic credits the action with the state's effect (slope
    near 0.5 here); given the departure from the logged actions' fit it learns the action's own."""
    rng = np.random.default_rng(12)
    states = rng.normal(size=(4096, STATE_SIZE))
    driver, click = states[:, 0], FEED_ACTION_NAMES.index("click")
    exploration = 0.3 * rng.normal(size=(4096, ACTION_SIZE))
    actions = exploration.copy()
    actions[:, click] += 1.5 * driver
    rewards = 2.0 * np.tanh(2.0 * driver) + 0.1 * exploration[:, click] + 0.1 * rng.normal(size=4096)
    fitted = statistics_of(states, rewards[:, None], actions).logged_action_coef

    assert abs(_action_slope_learnt(fitted, states, actions, rewards) - 0.1) < 0.05
    assert _action_slope_learnt(np.zeros_like(fitted), states, actions, rewards) > 0.3


def test_a_later_funnel_heads_loss_does_not_reach_an_earlier_heads_weights():
    critic = _critic(funnel=("click", "like"))
    like = signals.FEED_SIGNALS.index("like")
    rng = np.random.default_rng(6)
    states, actions = _states(rng, 16), _actions(rng, 16)
    click_weights = _head_variables(critic, "click")
    like_weights = _head_variables(critic, "like")
    torso = [v for v in critic.trainable_variables if "/critic_" in v.name]
    assert len(click_weights) == len(like_weights) == 4 and torso

    with tf.GradientTape() as tape:
        q, _ = critic((states, actions))
        loss = tf.reduce_sum(tf.square(q[:, like]))
    grads = tape.gradient(loss, click_weights + like_weights + torso)

    click_grads, rest = grads[: len(click_weights)], grads[len(click_weights) :]
    assert all(g is None or not np.any(g.numpy()) for g in click_grads)
    assert all(g is not None and np.any(g.numpy()) for g in rest)  # it trains its own head and the torso


def test_a_later_funnel_head_reads_the_earlier_heads_value():
    rng = np.random.default_rng(7)
    states, actions = _states(rng, 8), _actions(rng, 8)
    click, like = signals.FEED_SIGNALS.index("click"), signals.FEED_SIGNALS.index("like")
    watch = signals.FEED_SIGNALS.index("watch_time")

    def outputs_before_and_after_moving_the_click_head(funnel):
        tf.keras.utils.set_random_seed(99)
        critic = _critic(funnel=funnel)
        before, _ = critic((states, actions))
        (click_bias,) = [v for v in _head_variables(critic, "click", hidden=False) if "bias" in v.name]
        click_bias.assign_add([5.0])
        after, _ = critic((states, actions))
        return before.numpy(), after.numpy()

    before, after = outputs_before_and_after_moving_the_click_head(("click", "like"))
    np.testing.assert_allclose(after[:, click] - before[:, click], 5.0, rtol=1e-5)
    assert np.abs(after[:, like] - before[:, like]).max() > 1e-3  # like sees click's value
    np.testing.assert_array_equal(after[:, watch], before[:, watch])  # outside the funnel: unaffected

    before, after = outputs_before_and_after_moving_the_click_head(())
    np.testing.assert_array_equal(after[:, like], before[:, like])  # without a funnel the heads are apart


def test_independent_trunks_keep_each_heads_loss_in_its_own_trunk():
    """The paper's critics: a sparse head's TD error cannot move the features the other heads read."""
    critic = _critic()
    follow = signals.FEED_SIGNALS.index("follow")
    rng = np.random.default_rng(8)
    states, actions = _states(rng, 16), _actions(rng, 16)
    trunks = [v for v in critic.trainable_variables if "/critic_" in v.name]  # kernels and biases
    assert [v.shape[0] for v in trunks] == [len(signals.FEED_SIGNALS)] * 4  # one stack per head, per layer
    with tf.GradientTape() as tape:
        q, _ = critic((states, actions))
        loss = tf.reduce_sum(tf.square(q[:, follow]))
    for grad in tape.gradient(loss, trunks):
        per_stack = np.abs(grad.numpy()).sum(axis=(1, 2))
        assert per_stack[follow] > 0.0
        assert not np.any(np.delete(per_stack, follow))


@pytest.mark.parametrize("shared_trunk", [False, True])
def test_the_critics_values_by_hand_through_each_heads_trunk(shared_trunk):
    """Each head's value: its trunk (its own stack of every torso layer, or the one torso), then its two
    head layers, all ReLU but the output, on [normalised state, action departure]."""
    coef = np.random.default_rng(13).normal(size=(STATE_SIZE + 1, ACTION_SIZE))
    critic = _critic(shared_trunk=shared_trunk, logged_action_coef=coef)
    _randomise(critic, 14)
    rng = np.random.default_rng(15)
    states, actions = _states(rng, 8), _actions(rng, 8)
    normalised = (states.numpy().astype(np.float64) - STATE_MEAN) / STATE_STD
    inputs = np.concatenate([normalised, actions.numpy() - coef[0] - normalised @ coef[1:]], axis=1)
    expected = np.empty((8, len(signals.FEED_SIGNALS)))
    for head, (hidden, out) in enumerate(critic._heads):
        x = inputs
        for layer in critic._torso:
            if shared_trunk:
                x = _relu(_dense(layer, x))
            else:
                x = _relu(x @ layer.kernel.numpy()[head] + layer.bias.numpy()[head])
        expected[:, head] = _dense(out, _relu(_dense(hidden, x)))[:, 0]
    q, _ = critic((states, actions))
    np.testing.assert_allclose(q.numpy(), expected, rtol=1e-3, atol=1e-3)


def test_each_independent_trunk_starts_glorot_uniform_on_its_own_layer_shape():
    """Every stack drawn as its own Dense layer would be (limit sqrt(6 / (fan_in + units))), not as one
    3-d kernel (whose Glorot limit counts every stack in its fans), and no two stacks alike."""
    critic = _critic()
    fan_in = STATE_SIZE + ACTION_SIZE
    for layer in critic._torso:
        kernel = layer.kernel.numpy()
        limit = math.sqrt(6.0 / (fan_in + kernel.shape[2]))
        per_stack = np.abs(kernel).max(axis=(1, 2))
        assert np.all(per_stack <= limit) and np.all(per_stack > 0.9 * limit), (per_stack, limit)
        assert len({k.tobytes() for k in kernel}) == kernel.shape[0]
        assert layer.bias.shape == (len(signals.FEED_SIGNALS), 1, kernel.shape[2])
        fan_in = kernel.shape[2]


@pytest.mark.parametrize("actions", [1, 0])
def test_the_logged_action_fit_departs_any_number_of_actions(actions):
    """One action is fitted like many; none (the pair critic's) passes through as an empty action."""
    rng = np.random.default_rng(16)
    coef = rng.normal(size=(STATE_SIZE + 1, actions))
    states = rng.normal(size=(5, STATE_SIZE)).astype(np.float32)
    logged = rng.normal(size=(5, actions)).astype(np.float32)
    departure = _LoggedActionFit(coef).departure(tf.constant(states), tf.constant(logged))
    np.testing.assert_allclose(departure.numpy(), logged - coef[0] - states @ coef[1:], rtol=1e-4, atol=1e-4)


def test_a_shared_trunk_is_read_by_every_head():
    critic = _critic(shared_trunk=True)
    rng = np.random.default_rng(9)
    states, actions = _states(rng, 8), _actions(rng, 8)
    before, _ = critic((states, actions))
    (first,) = [v for v in critic.trainable_variables if v.name.endswith("critic_0/bias:0")]
    first.assign_add(tf.ones_like(first))
    after, _ = critic((states, actions))
    assert np.all(np.abs(after.numpy() - before.numpy()).max(axis=0) > 1e-4)  # every head moved


def test_unknown_funnel_signal_is_rejected_by_the_critic():
    with pytest.raises(ValueError, match=r"funnel signals \['clicks'\] are not among"):
        _critic(funnel=("clicks", "like"))


# -- agent config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        pytest.param({"aux_lambda": -0.1}, "aux_lambda should be >= 0", id="negative-aux-lambda"),
        pytest.param({"behaviour_lambda": 0.0}, "behaviour_lambda should be positive", id="zero-behaviour"),
        pytest.param({"behaviour_lambda": -1.0}, "behaviour_lambda should be positive", id="neg-behaviour"),
        pytest.param({"bc_weight": -1.0}, "bc_weight should be >= 0", id="negative-bc"),
        pytest.param({"max_weight": 0.0}, "max_weight should be positive", id="zero-cap"),
        pytest.param(
            {"actor_hidden": ()}, "actor_hidden should list positive layer sizes", id="no-actor-layers"
        ),
        pytest.param({"critic_hidden": (64, 0)}, "critic_hidden should list positive", id="zero-width"),
        pytest.param({"head_hidden": 0}, "head_hidden should be positive", id="zero-head"),
        pytest.param({"target_update_tau": 0.0}, r"target_update_tau should be in \(0, 1\]", id="tau-zero"),
        pytest.param({"target_update_tau": 1.5}, r"target_update_tau should be in \(0, 1\]", id="tau-big"),
        pytest.param(
            {"funnel": ("click", "likes")}, r"funnel names unknown signals \['likes'\]", id="funnel"
        ),
        pytest.param(
            {"critic_trunk": "split"},
            r"critic_trunk should be one of \['independent', 'shared'\]",
            id="trunk",
        ),
    ],
)
def test_agent_config_rejects_bad_values(settings, message):
    with pytest.raises(ValueError, match=message):
        AgentConfig(**settings)


def test_agent_config_accepts_the_edges_of_its_ranges():
    """A full target copy every step (tau 1) and one-unit layers are legal, if unusual."""
    config = AgentConfig(target_update_tau=1.0, actor_hidden=(1,), critic_hidden=(1, 1))
    assert (config.target_update_tau, config.actor_hidden, config.critic_hidden) == (1.0, (1,), (1, 1))


def test_agent_config_accepts_its_defaults_and_a_feed_funnel():
    assert AgentConfig().behaviour_lambda > 0
    assert AgentConfig(funnel=("click", "like", "follow"), aux_lambda=0.0).funnel == (
        "click",
        "like",
        "follow",
    )
