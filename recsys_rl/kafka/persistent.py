"""A broker that outlives the command that started it: ``recsys-rl broker start|stop|status``.

Every other verb that needs Kafka either is given ``--bootstrap-servers`` or starts a broker for its
own lifetime, so what ``simulate`` wrote was gone before ``build-transitions`` could read it. A broker
started here keeps running in the background (its own process group, its output in a log file), and
a record of it, ``broker.json`` in the broker directory, tells the later commands where it listens
(`running_address`: the default of their ``--bootstrap-servers``) and ``broker stop`` what to stop.

The directory is ``$RECSYS_RL_BROKER_DIR`` or ``~/.local/state/recsys-rl/broker``. It is the broker's
working directory too: Apache Kafka keeps its log directory there across restarts; Tansu, the
embedded default, keeps records in memory, so they last as long as its process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from recsys_rl.atomic_json import write_json_atomic
from recsys_rl.kafka.broker import BROKER_KINDS, EmbeddedBroker, LocalKafkaBroker
from recsys_rl.kafka.setup_errors import BrokerConfigError
from recsys_rl.processes import alive, stop_group

BROKER_DIR_ENV = "RECSYS_RL_BROKER_DIR"
RECORD = "broker.json"
STOP_GRACE_S = 15.0


def broker_dir(configured: str | None = None) -> Path:
    """``configured``, else $RECSYS_RL_BROKER_DIR, else the user's state directory."""
    chosen = configured or os.environ.get(BROKER_DIR_ENV)
    return Path(chosen).expanduser() if chosen else Path.home() / ".local" / "state" / "recsys-rl" / "broker"


@dataclass(frozen=True)
class BrokerRecord:
    """What ``broker start`` notes of the broker it left running."""

    kind: str
    bootstrap_servers: str
    pid: int  # the broker process, leader of its own process group
    started_at: str  # UTC, ISO 8601
    directory: str

    @property
    def log(self) -> Path:
        return Path(self.directory) / "broker.log"


def start_broker(kind: str, directory: Path) -> BrokerRecord:
    """Start a ``kind`` broker in ``directory`` and leave it running; refused while one runs there."""
    if kind not in BROKER_KINDS:
        raise BrokerConfigError(f"unknown broker kind {kind!r}: expected one of {', '.join(BROKER_KINDS)}")
    if (running := running_broker(directory)) is not None:
        raise BrokerConfigError(
            f"a {running.kind} broker already runs at {running.bootstrap_servers} (pid {running.pid}, "
            f"{directory}); stop it first with: recsys-rl broker stop"
        )
    broker = EmbeddedBroker(workdir=directory) if kind == "embedded" else LocalKafkaBroker(workdir=directory)
    broker.start()
    record = BrokerRecord(
        kind=kind,
        bootstrap_servers=broker.bootstrap_servers,
        pid=broker.detach(),
        started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        directory=str(directory),
    )
    write_json_atomic(directory / RECORD, dataclasses.asdict(record))
    return record


def running_broker(directory: Path) -> BrokerRecord | None:
    """The broker recorded in ``directory`` if its process still runs; None otherwise. A record whose
    process is gone (the machine restarted, the broker was killed) is removed, as no broker is there."""
    path = directory / RECORD
    try:
        record = BrokerRecord(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as err:
        raise BrokerConfigError(f"{path} is not a broker record ({err}); remove it") from None
    if alive(record.pid):
        return record
    path.unlink(missing_ok=True)
    return None


def stop_broker(directory: Path) -> BrokerRecord | None:
    """Stop the broker recorded in ``directory``; returns it, or None when none was running."""
    record = running_broker(directory)
    if record is not None:
        stop_group(record.pid, STOP_GRACE_S)
        (directory / RECORD).unlink(missing_ok=True)
    return record


def running_address() -> str | None:
    """Where the broker started by ``recsys-rl broker start`` listens, if one runs: the default broker of
    every verb that takes ``--bootstrap-servers``. Never fails: a broken record means no default."""
    try:
        record = running_broker(broker_dir())
    except (BrokerConfigError, OSError):
        return None
    return None if record is None else record.bootstrap_servers
