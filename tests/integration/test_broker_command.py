"""``recsys-rl broker start|stop|status``: a broker the README's next step still finds (issue 23)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recsys_rl.cli.main import main
from recsys_rl.processes import alive, stop_process

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def broker_dir(tmp_path, monkeypatch):
    directory = tmp_path / "broker"
    monkeypatch.setenv("RECSYS_RL_BROKER_DIR", str(directory))
    monkeypatch.delenv("RECSYS_RL_BOOTSTRAP_SERVERS", raising=False)
    yield directory
    main(["broker", "stop"])  # whatever a failed test left running


def _address(text: str) -> str:
    found = re.search(r"broker running at (\S+)", text)
    assert found is not None, text
    return found.group(1)


def _written(out: str) -> dict[str, int]:
    return {m[0]: int(m[1]) for m in re.findall(r"(recsys\.\w+)\s+(\d+) records written", out)}


def test_the_next_command_finds_the_broker_and_what_the_last_one_wrote(
    broker_dir, tmp_path, capsys, monkeypatch
):
    assert main(["broker", "status"]) == 3
    assert "no broker running" in capsys.readouterr().out
    assert main(["broker", "start"]) == 0
    address = _address(capsys.readouterr().out)
    assert main(["broker", "start"]) == 2  # one at a time per directory
    assert f"already runs at {address}" in capsys.readouterr().err

    # no --bootstrap-servers anywhere: each verb takes the running broker
    assert main(["simulate", "--users", "20", "--seed", "3"]) == 0
    simulated = capsys.readouterr().out
    assert f"wrote to Kafka at {address}" in simulated and "stops now" not in simulated
    assert main(["build-transitions", "--group", "readme", "--out", str(tmp_path / "data")]) == 0
    built = capsys.readouterr().out
    assert f"records read {sum(_written(simulated).values())} = used" in built

    assert main(["broker", "status"]) == 0
    assert _address(capsys.readouterr().out) == address
    settings = tmp_path / "broker.yaml"  # every verb takes --config, this one too
    settings.write_text(f"dir: {broker_dir}\n")
    monkeypatch.delenv("RECSYS_RL_BROKER_DIR")
    assert main(["broker", "status", "--config", str(settings)]) == 0
    assert _address(capsys.readouterr().out) == address
    monkeypatch.setenv("RECSYS_RL_BROKER_DIR", str(broker_dir))
    assert main(["broker", "stop"]) == 0
    assert f"stopped the embedded broker at {address}" in capsys.readouterr().out
    assert main(["broker", "status", "--json"]) == 3 and capsys.readouterr().out.strip() == "null"


def test_a_broker_that_died_is_not_taken_for_a_running_one(broker_dir, capsys):
    assert main(["broker", "start"]) == 0
    capsys.readouterr()
    pid = int((broker_dir / "broker.json").read_text().split('"pid": ')[1].split(",")[0])
    os.killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)  # our child (started in-process): reap it as init would
    assert not alive(pid)
    assert main(["broker", "status"]) == 3 and not (broker_dir / "broker.json").exists()
    assert main(["broker", "start"]) == 0  # and a new one starts in its place
    assert "embedded broker running at" in capsys.readouterr().out


def test_apache_kafka_keeps_its_records_across_a_restart(broker_dir, tmp_path, capsys):
    assert main(["broker", "start", "--kind", "local-kafka"]) == 0
    capsys.readouterr()
    assert main(["simulate", "--users", "10", "--seed", "4"]) == 0
    written = sum(_written(capsys.readouterr().out).values())
    assert main(["broker", "stop"]) == 0
    assert main(["broker", "start", "--kind", "local-kafka"]) == 0
    capsys.readouterr()
    assert main(["build-transitions", "--group", "after-restart", "--out", str(tmp_path / "data")]) == 0
    assert f"records read {written} = used" in capsys.readouterr().out


def _broker_started_under(tmp: Path, timeout_s: float) -> int:
    """The pid of the embedded broker a command started with ``tmp`` as its TMPDIR: the process whose working
    directory is the broker's private directory there."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for workdir in tmp.glob("recsys-rl-embedded-*"):
            for proc in Path("/proc").iterdir():
                with contextlib.suppress(OSError):
                    if proc.name.isdigit() and (proc / "cwd").resolve() == workdir.resolve():
                        return int(proc.name)
        time.sleep(0.2)
    raise AssertionError(f"no embedded broker started under {tmp} in {timeout_s} s")


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "recsys_rl.cli.main", "demo", "--users", "50", "--out"],
        [str(BENCH / "pipeline.py"), "--quick", "--out"],
    ],
    ids=["demo", "benchmark"],
)
def test_a_job_stopped_with_sigterm_stops_the_embedded_broker_it_started(command, broker_dir, tmp_path):
    """A scheduler stops a job with SIGTERM; Python's default handling of it ends the process without
    unwinding, which left the broker a demo or a benchmark had started running, with its port and memory."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with (tmp_path / "stderr").open("w") as stderr:  # a file: a pipe nobody reads fills and stalls the job
        job = subprocess.Popen(
            [sys.executable, *command, str(tmp_path / "out")],
            env={**os.environ, "TMPDIR": str(tmp)},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            broker = _broker_started_under(tmp, timeout_s=120)
            job.send_signal(signal.SIGTERM)
            assert job.wait(timeout=60) == 128 + signal.SIGTERM
        finally:
            stop_process(job, grace_s=1)
    if command[1] == "recsys_rl.cli.main":  # why it stopped, where a scheduler's log shows it
        assert (tmp_path / "stderr").read_text().splitlines()[-1] == "recsys-rl demo: terminated"
    assert not alive(broker)
    assert not list(tmp.glob("recsys-rl-embedded-*"))  # and its directory is gone with it
