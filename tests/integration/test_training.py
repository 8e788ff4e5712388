"""The training job on a real pipeline-built dataset: export and reload, resume after a kill, divergence."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from recsys_rl.dataset_contract import USER_AUTHOR
from recsys_rl.kafka.broker import free_port
from recsys_rl.training.agents.base import AgentConfig
from recsys_rl.training.agents.data import open_dataset, read_transitions, transition_statistics
from recsys_rl.training.agents.factory import build_agent, build_pair_value_agent
from recsys_rl.training.agents.policy_io import (
    PolicyLoadError,
    export_pair_value_policy,
    export_policy,
    load_feed_policy,
    load_pair_value_policy,
    numpy_actor,
    numpy_pair_value,
)
from recsys_rl.training.pair_value import PairValueConfig
from recsys_rl.training.train import TrainConfig, TrainingDivergedError, train

pytestmark = pytest.mark.integration

SMALL = AgentConfig(actor_hidden=(16,), critic_hidden=(32,), head_hidden=8)


def _config(dataset: Path, out: Path, **overrides) -> TrainConfig:
    settings = {
        "algo": "tscac",
        "data": str(dataset),
        "out": str(out),
        "steps": 40,
        "batch_size": 128,
        "checkpoint_every": 10,
        "log_every": 10,
        "shuffle_buffer": 4096,
        "agent": SMALL,
        "pair": PairValueConfig(hidden=(16,)),
        **overrides,
    }
    return TrainConfig(**settings)


def _states(dataset: Path, n: int = 256) -> np.ndarray:
    batch = next(iter(read_transitions(open_dataset(dataset), n, seed=3)))
    return batch.time_step.observation.numpy()


def test_exported_policy_reloads_with_identical_actions_and_densities(feed_dataset: Path, tmp_path: Path):
    dataset = open_dataset(feed_dataset)
    agent = build_agent("tscac", transition_statistics(dataset), SMALL, stage_one_steps=0)
    step = tf.function(agent.train, autograph=False)
    batches = iter(read_transitions(dataset, 128, seed=0))
    for _ in range(5):  # move the weights away from their initial values
        step(next(batches))
    export_policy(agent, tmp_path / "policy", {"version": "test-v1"})
    policy = load_feed_policy(tmp_path / "policy")
    states = _states(feed_dataset)

    mean, std = agent.actor.mean_and_std(states)
    np.testing.assert_allclose(policy.mean(states), mean.numpy(), rtol=0, atol=1e-6)
    actions = mean.numpy() + 0.5
    dist, _ = agent.actor(states)
    np.testing.assert_allclose(policy.log_prob(states, actions), dist.log_prob(actions).numpy(), atol=1e-4)

    sampled = load_feed_policy(tmp_path / "policy", sample=True)
    first, first_logp = sampled.act(states, np.random.default_rng(11))
    again, again_logp = sampled.act(states, np.random.default_rng(11))
    other, _ = sampled.act(states, np.random.default_rng(12))
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first_logp, again_logp)
    assert not np.allclose(first, other)
    np.testing.assert_allclose(first_logp, policy.log_prob(states, first), atol=1e-4)
    # the draws spread like the policy's own std
    np.testing.assert_allclose((first - mean.numpy()).std(axis=0), std.numpy()[0], rtol=0.25)
    np.testing.assert_allclose(sampled.std(states), std.numpy(), atol=1e-6)

    # the serving entry point: a stateless seed gives a reproducible draw and its exact log-density
    inputs = {"observation": tf.constant(states), "seed": tf.constant([[5, 6]], tf.int32)}
    drawn = policy.model.sample_action(inputs)
    redrawn = policy.model.sample_action(inputs)
    np.testing.assert_array_equal(drawn["action"].numpy(), redrawn["action"].numpy())
    np.testing.assert_allclose(
        drawn["log_probability"].numpy(), policy.log_prob(states, drawn["action"].numpy()), atol=1e-4
    )


def test_the_numpy_twin_of_an_exported_actor_matches_it_and_a_mismatch_is_refused(
    feed_dataset: Path, tmp_path: Path
):
    dataset = open_dataset(feed_dataset)
    agent = build_agent("tscac", transition_statistics(dataset), SMALL, stage_one_steps=0)
    step = tf.function(agent.train, autograph=False)
    batches = iter(read_transitions(dataset, 128, seed=0))
    for _ in range(5):
        step(next(batches))
    export_policy(agent, tmp_path / "policy", {"version": "test-v1"})
    policy = load_feed_policy(tmp_path / "policy")
    twin = numpy_actor(policy)
    states = _states(feed_dataset)
    np.testing.assert_allclose(twin.mean(states), policy.mean(states), atol=1e-5)
    actions = twin.mean(states) + 0.3
    np.testing.assert_allclose(twin.log_prob(states, actions), policy.log_prob(states, actions), atol=1e-4)
    # a policy loaded with its twin acts as the SavedModel does, on the same draws
    for sample in (False, True):
        saved = load_feed_policy(tmp_path / "policy", sample=sample)
        fast = load_feed_policy(tmp_path / "policy", sample=sample, numpy=True)
        assert fast.twin is not None and saved.twin is None
        by_saved = saved.act(states, np.random.default_rng(3))
        by_twin = fast.act(states, np.random.default_rng(3))
        np.testing.assert_allclose(by_twin[0], by_saved[0], atol=1e-5)
        np.testing.assert_allclose(by_twin[1], by_saved[1], atol=1e-3)

    class Drifted(type(policy)):
        def mean(self, states):  # a SavedModel whose function is not the layout numpy_actor reads
            return super().mean(states) + 0.01

    drifted = Drifted(policy.directory, policy.manifest, policy.model)
    with pytest.raises(PolicyLoadError, match="numpy actor differs from the SavedModel"):
        numpy_actor(drifted)


def test_a_tampered_export_is_refused(feed_dataset: Path, tmp_path: Path):
    dataset = open_dataset(feed_dataset)
    agent = build_agent("bc", transition_statistics(dataset), SMALL, stage_one_steps=0)
    export_policy(agent, tmp_path / "policy", {"version": "test-v1"})
    variables = next((tmp_path / "policy" / "variables").glob("variables.data-*"))
    data = variables.read_bytes()
    variables.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(PolicyLoadError, match="does not match its manifest"):
        load_feed_policy(tmp_path / "policy")
    with pytest.raises(PolicyLoadError, match="not an exported policy"):
        load_feed_policy(tmp_path)


class _Killed(Exception):
    pass


def test_an_exported_pair_value_reloads_with_the_critics_values(feed_dataset: Path, tmp_path: Path):
    dataset = open_dataset(feed_dataset, USER_AUTHOR)
    agent = build_pair_value_agent("ua-mtcl", transition_statistics(dataset), PairValueConfig(hidden=(16,)))
    step = tf.function(agent.train, autograph=False)
    batches = iter(read_transitions(dataset, 128, seed=0))
    first_states = next(batches).time_step.observation
    before = agent.policy.values(first_states).numpy()
    for _ in range(5):
        step(next(batches))
    export_pair_value_policy(agent, tmp_path / "policy", {"version": "pair-v1"})
    saved = load_pair_value_policy(tmp_path / "policy")
    states = next(batches).time_step.observation.numpy()

    expected = agent.policy.values(states).numpy()
    assert expected.shape == (128, 4)
    assert not np.allclose(agent.policy.values(first_states).numpy(), before)  # the steps trained it
    np.testing.assert_allclose(saved.values(states), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(numpy_pair_value(saved).values(states), expected, rtol=1e-5, atol=1e-6)
    # PolicySaver's own entry point serves the same values as the policy's action
    time_step = ts.restart(tf.constant(states), batch_size=128, reward_spec=tf.TensorSpec([4], tf.float32))
    np.testing.assert_allclose(saved.model.action(time_step, ()).action.numpy(), expected, atol=1e-6)
    assert saved.manifest["signals"] == ["click", "follow", "gift", "author_return"]
    assert saved.version == "pair-v1"
    np.testing.assert_allclose(
        saved.manifest["reward_std"], transition_statistics(dataset).reward_std, rtol=1e-6
    )
    with pytest.raises(PolicyLoadError, match="not a feed_policy"):
        load_feed_policy(tmp_path / "policy")


@pytest.mark.parametrize("algo", ["ua-mtcl", "ua-independent"])
def test_serving_builds_the_exported_ranking_term_and_refuses_an_export_without_one(
    algo: str, feed_dataset: Path, tmp_path: Path
):
    """Serving's term is the export's: its numpy twin of either critic, combined by the coefficients."""
    from recsys_rl.serving.policies import load_user_author_decider

    dataset = open_dataset(feed_dataset, USER_AUTHOR)
    # target_update 1: the served average is the last step's network, which five steps move off zero
    config = PairValueConfig(
        hidden=(16, 8), term_coefficients=(0.0, 2.0, 0.0, 1.0), term_weight=3.0, target_update=1.0
    )
    agent = build_pair_value_agent(algo, transition_statistics(dataset), config)
    batches = iter(read_transitions(dataset, 64, seed=0))
    for _ in range(5):  # the heads start at zero: trained, every value differs
        agent.train(next(batches))
    export_pair_value_policy(agent, tmp_path / "policy", {"version": "pair-v1"})
    decider = load_user_author_decider(tmp_path / "policy", "ua-v1")
    assert (decider.weight.mean, decider.weight.std) == (pytest.approx(np.log(3.0)), 0.3)
    states = next(batches).time_step.observation.numpy()
    values = agent.policy.values(states).numpy()
    assert np.all(np.abs(values).max(axis=0) > 1e-7)
    expected = values @ (np.array([0.0, 2.0, 0.0, 1.0]) / transition_statistics(dataset).reward_std)
    np.testing.assert_allclose(decider.term.of_states(states), expected, rtol=1e-4, atol=1e-9)

    manifest_path = tmp_path / "policy" / "policy.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["term"]  # an export from before serving built the term
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(PolicyLoadError, match="no user-author value with a ranking term"):
        load_user_author_decider(tmp_path / "policy", "ua-v1")


def _kill_at(step: int):
    def progress(event: str, fields: dict) -> None:
        if event == "step" and fields["step"] == step:
            raise _Killed

    return progress


def _weights(run: Path) -> list[np.ndarray]:
    reader = tf.train.load_checkpoint(str(run / "checkpoints"))
    names = sorted(
        n for n in reader.get_variable_to_shape_map() if n.startswith("agent/") and "OPTIMIZER" not in n
    )
    return [reader.get_tensor(n) for n in names]


@pytest.mark.parametrize("algo", ["tscac", "ua-mtcl"])
def test_a_killed_run_resumes_and_ends_where_an_uninterrupted_run_ends(
    feed_dataset: Path, tmp_path: Path, algo: str
):
    straight = train(_config(feed_dataset, tmp_path / "straight", algo=algo))

    interrupted = _config(feed_dataset, tmp_path / "interrupted", algo=algo)
    with pytest.raises(_Killed):
        train(interrupted, _kill_at(30))  # killed before its step-30 checkpoint: steps 21-30 are redone
    assert not (tmp_path / "interrupted" / "manifest.json").exists()
    resumed = train(interrupted)

    assert resumed.resumed_from_step == 20
    assert resumed.manifest["steps"] == straight.manifest["steps"] == 40
    for a, b in zip(_weights(tmp_path / "straight"), _weights(tmp_path / "interrupted"), strict=True):
        np.testing.assert_array_equal(a, b)
    logged = [
        json.loads(line)["step"]
        for line in (tmp_path / "interrupted" / "metrics.jsonl").read_text().splitlines()
    ]
    assert logged == [10, 20, 30, 40]
    again = train(interrupted)
    assert again.already_complete


def test_a_run_on_predicted_rewards_scales_its_critics_by_them_and_records_the_choice(
    feed_dataset: Path, tmp_path: Path
):
    result = train(_config(feed_dataset, tmp_path / "run", steps=10, rewards="predicted"))
    recorded = json.loads((result.run_dir / "statistics.json").read_text())["reward_std"]
    dataset = open_dataset(feed_dataset)
    assert recorded == pytest.approx(transition_statistics(dataset, rewards="predicted").reward_std.tolist())
    assert recorded != pytest.approx(transition_statistics(dataset).reward_std.tolist())
    assert "rewards: predicted" in (result.run_dir / "config.yaml").read_text()
    with pytest.raises(ValueError, match="rewards should be one of"):
        _config(feed_dataset, tmp_path / "other", rewards="expected")


def test_a_diverging_loss_stops_the_job_with_the_step_and_the_broken_losses(
    feed_dataset: Path, tmp_path: Path
):
    explosive = AgentConfig(
        actor_hidden=(16,),
        critic_hidden=(32,),
        head_hidden=8,
        critic_learning_rate=1e30,
        actor_learning_rate=1e30,
    )
    config = _config(feed_dataset, tmp_path / "run", algo="rcpo-mc", agent=explosive, steps=50)
    with pytest.raises(
        TrainingDivergedError, match=r"rcpo-mc: loss became (nan|inf) at step \d+ \(non-finite: \['"
    ):
        train(config)
    assert not (tmp_path / "run" / "policy").exists()


def test_a_short_tscac_run_beats_the_behaviour_policy_on_watch_time_in_the_simulator(
    feed_dataset: Path, tmp_path: Path
):
    """Ground truth, not OPE: the trained policy and the behaviour policy run on the same simulated world."""
    from recsys_rl.sim.sim_eval import SimEvalConfig, evaluate_policy

    config = _config(
        feed_dataset,
        tmp_path / "run",
        steps=600,
        batch_size=256,
        checkpoint_every=600,
        log_every=100,
        agent=AgentConfig(actor_hidden=(32, 32), critic_hidden=(64, 64)),
    )
    train(config)
    report = evaluate_policy(SimEvalConfig(policy=str(tmp_path / "run"), users=40_000, days=1, seed=0))
    watch = report["signals"]["watch_time"]
    # more than one paired standard error above the behaviour policy (the same users and draws)
    assert watch["difference"] > watch["difference_stderr"] > 0


_MIRRORED_RUN = """
import sys
import recsys_rl
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from recsys_rl.training.agents.base import AgentConfig
from recsys_rl.training.train import TrainConfig, train

config = TrainConfig(
    algo=sys.argv[3], data=sys.argv[1], out=sys.argv[2], steps=12, batch_size=64, checkpoint_every=6,
    log_every=6, devices=("/cpu:0", "/cpu:1"), agent=AgentConfig(actor_hidden=(16,), critic_hidden=(32,)),
)
print("replicas", train(config).manifest["replicas"])
"""


@pytest.mark.parametrize("algo", ["tscac", "rcpo"])
def test_training_mirrors_over_several_devices(feed_dataset: Path, tmp_path: Path, algo: str):
    """The multi-GPU path (MirroredStrategy), exercised on two logical CPU devices in a fresh process."""
    import subprocess
    import sys

    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", _MIRRORED_RUN, str(feed_dataset), str(run), algo],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "replicas 2" in done.stdout
    policy = load_feed_policy(run / "policy")
    actions = policy.mean(_states(feed_dataset, 64))
    assert np.all(np.isfinite(actions))
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [6, 12]


def _train_cli(feed_dataset: Path, out: Path, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    """``recsys-rl train`` in a process of its own (each worker of a cluster is one), on a small agent;
    returns the process and the file its output goes to (a file, not a pipe nobody reads while others run)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    config = out.parent / "small.yaml"
    config.write_text(
        "agent: {actor_hidden: [16], critic_hidden: [32], head_hidden: 8}\n"
        "log_every: 2\n"
        "checkpoint_every: 6\n"
    )
    argv = [
        sys.executable,
        "-m",
        "recsys_rl.cli.main",
        "train",
        "--data",
        str(feed_dataset),
        "--out",
        str(out),
    ]
    options = ["--config", str(config), "--steps", "12", "--batch-size", "64", *extra]
    log = out.parent / f"train{extra[-1] if extra else ''}.log"  # train.log, or train<worker index>.log
    with open(log, "wb") as output:
        process = subprocess.Popen([*argv, *options], stdout=output, stderr=subprocess.STDOUT)
    return process, log


def _finished(started: tuple[subprocess.Popen[bytes], Path], what: str, timeout_s: float = 600) -> None:
    process, log = started
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"{what} ran over {timeout_s} s: {log.read_text()[-2000:]}")
    assert process.returncode == 0, f"{what} failed: {log.read_text()[-3000:]}"


def test_two_workers_train_what_one_trains_on_the_same_global_batch(feed_dataset: Path, tmp_path: Path):
    """MultiWorkerMirroredStrategy: two local worker processes, one CPU replica each, over gRPC. The
    one-worker run goes first: beside them, three processes on two cores took longer in all."""
    _finished(_train_cli(feed_dataset, tmp_path / "one" / "run"), "the one-worker run")
    workers = ",".join(f"127.0.0.1:{free_port()}" for _ in range(2))
    started = [
        _train_cli(feed_dataset, tmp_path / "two" / "run", "--workers", workers, "--worker-index", str(index))
        for index in range(2)
    ]
    for index, process in enumerate(started):
        _finished(process, f"worker {index}")
    one, two = tmp_path / "one" / "run", tmp_path / "two" / "run"
    manifest = json.loads((two / "manifest.json").read_text())
    assert (manifest["workers"], manifest["replicas"]) == (2, 2)

    # each replica's half of every batch, gradients summed over the workers: the one-worker step, up to the
    # order of float additions
    expected = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines()]
    got = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in got] == [m["step"] for m in expected] == list(range(2, 13, 2))
    for mine, theirs in zip(got, expected, strict=True):
        for name in theirs.keys() - {"step", "transitions_per_s"}:
            assert mine[name] == pytest.approx(theirs[name], rel=2e-4, abs=1e-5), (mine["step"], name)
    states = _states(feed_dataset, 64)
    actions = load_feed_policy(two / "policy").mean(states)
    np.testing.assert_allclose(actions, load_feed_policy(one / "policy").mean(states), rtol=1e-3, atol=1e-4)
    # only the chief wrote the run directory: the other worker's saves went to scratch space, since removed
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())


def test_rcpo_multipliers_move_on_their_slower_timescale(feed_dataset: Path):
    """RCPO's two timescales: the actor steps on every batch, the multipliers once per period, driven by
    the constraint critic's discounted values."""
    dataset = open_dataset(feed_dataset)
    config = dataclasses.replace(SMALL, multiplier_every=3, multiplier_learning_rate=0.5)
    agent = build_agent("rcpo", transition_statistics(dataset), config, stage_one_steps=0)
    step = tf.function(agent.train, autograph=False)
    batches = iter(read_transitions(dataset, 128, seed=0))
    seen = []
    for _ in range(6):
        info = step(next(batches))
        seen.append(agent.multipliers.numpy().copy())
    initial = np.full(len(seen[0]), config.initial_multiplier)
    np.testing.assert_array_equal(seen[0], initial)
    np.testing.assert_array_equal(seen[1], initial)
    assert not np.array_equal(seen[2], initial)  # the first period's step
    np.testing.assert_array_equal(seen[3], seen[2])
    np.testing.assert_array_equal(seen[4], seen[2])
    assert not np.array_equal(seen[5], seen[4])
    assert {f"constraint_critic/{s}" for s in ("click", "hate")} <= set(info.extra)
