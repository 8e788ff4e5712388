"""Deadlines and readiness: the feature budget shrinks to the client's deadline; a passed one is refused."""

from __future__ import annotations

import grpc
import pytest

from recsys_rl.serving.metrics import ServingMetrics
from recsys_rl.serving.service import Abort, Handlers
from recsys_rl.serving.settings import ServeConfig


class Context:
    def __init__(self, remaining: float | None) -> None:
        self.remaining = remaining

    def time_remaining(self) -> float | None:
        return self.remaining


def handlers(ready: bool = True) -> Handlers:
    config = ServeConfig(feature_budget_ms=5.0)
    return Handlers(config, {}, None, None, None, ServingMetrics(), lambda: ready, started_at_ms=0)


@pytest.mark.parametrize(("remaining", "budget"), [(None, 0.005), (10.0, 0.005), (0.004, 0.002)])
def test_the_feature_budget_is_cut_short_by_the_deadline(remaining, budget):
    assert handlers()._budget_s(Context(remaining)) == pytest.approx(budget)


def test_a_passed_deadline_and_a_server_still_loading_are_refused():
    with pytest.raises(Abort) as err:
        handlers()._budget_s(Context(0.0))
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    with pytest.raises(Abort) as err:
        handlers(ready=False)._budget_s(Context(None))
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
