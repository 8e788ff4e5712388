"""A server's stop is bounded step by step: a gRPC stop that hangs past its grace must not keep the
decision log from flushing nor the process from exiting (serving/server.py ``RunningServer.stop``)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from recsys_rl.serving import server as server_module
from recsys_rl.serving.metrics import ServingMetrics


async def _forever() -> None:
    await asyncio.Event().wait()


class _GrpcServer:
    """A gRPC server whose stop returns at once or never, as one stuck on a transport would."""

    def __init__(self, hangs: bool) -> None:
        self.hangs = hangs

    async def stop(self, grace: float | None) -> None:
        if self.hangs:
            await _forever()


class _Health:
    def __init__(self, hangs: bool) -> None:
        self.hangs = hangs

    async def enter_graceful_shutdown(self) -> None:
        if self.hangs:
            await _forever()


class _Closes:
    """Stands in for the watcher, the decision log and the readers: records that it was stopped."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def stop(self) -> None:
        self.closed.set()

    close = stop


@pytest.mark.parametrize("hung", ["grpc stop", "health"])
def test_a_shutdown_step_that_hangs_past_its_bound_is_left_and_the_decision_log_still_flushes(
    monkeypatch, hung
):
    monkeypatch.setattr(server_module, "STOP_OVERRUN_S", 0.2)
    watcher, log, reader = _Closes(), _Closes(), _Closes()
    running = server_module.RunningServer(
        port=0,
        metrics=ServingMetrics(),
        metrics_port=None,
        holders={},
        _server=_GrpcServer(hangs=hung == "grpc stop"),
        _loop=server_module._EventLoop(),
        _health=_Health(hangs=hung == "health"),
        _watcher=watcher,
        _log=log,
        _readers=(reader,),
        _metrics_http=None,
        _ready=threading.Event(),
    )
    stopping = threading.Thread(target=running.stop, kwargs={"grace_s": 0.1}, daemon=True)
    stopping.start()
    stopping.join(10.0)
    assert not stopping.is_alive(), f"stop waited on the hung {hung}"
    assert log.closed.is_set() and watcher.closed.is_set() and reader.closed.is_set()


def test_a_coroutine_past_its_timeout_is_cancelled_on_the_loop():
    loop = server_module._EventLoop()
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeoutError):
        loop.run(forever(), timeout_s=0.05)
    assert cancelled.wait(5.0)
    assert loop.run(asyncio.sleep(0, result="still serving"), timeout_s=5.0) == "still serving"
    loop.close()
