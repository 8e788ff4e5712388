"""The admin token interceptor: who reaches an admin RPC and who is refused, with which code."""

from __future__ import annotations

import asyncio
from typing import NamedTuple

import grpc
import pytest

from recsys_rl.serving.auth import ADMIN_PREFIX, AdminTokenInterceptor

TOKEN = "s3cret-token-0123456789"
RELOAD = f"{ADMIN_PREFIX}Reload"
PASSED = object()  # what the continuation (the real handler) returns


class Details(NamedTuple):  # grpc.HandlerCallDetails' two fields
    method: str
    invocation_metadata: tuple[tuple[str, str], ...]


class Aborted(Exception):
    pass


class Context:
    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


async def _passed(details: Details):
    return PASSED


def intercept(method: str, *metadata: tuple[str, str]):
    return asyncio.run(AdminTokenInterceptor(TOKEN).intercept_service(_passed, Details(method, metadata)))


@pytest.mark.parametrize(
    "authorization",
    [
        pytest.param(f"Bearer {TOKEN}", id="Bearer"),
        # RFC 6750 section 2.1 with RFC 7235 section 2.1: the scheme is case-insensitive
        pytest.param(f"bearer {TOKEN}", id="bearer"),
        pytest.param(f"BEARER {TOKEN}", id="BEARER"),
        pytest.param(f"bEaReR {TOKEN}", id="bEaReR"),
    ],
)
def test_the_token_under_any_case_of_the_bearer_scheme_reaches_admin_rpcs(authorization):
    assert intercept(RELOAD, ("authorization", authorization)) is PASSED


@pytest.mark.parametrize(
    "metadata",
    [
        pytest.param((), id="no-metadata"),
        pytest.param((("authorization", f"Bearer {TOKEN}x"),), id="wrong-token"),
        pytest.param((("authorization", f"Bearer {TOKEN[:-1]}"),), id="token-prefix"),
        pytest.param((("authorization", TOKEN),), id="no-scheme"),
        pytest.param((("authorization", f"Basic {TOKEN}"),), id="other-scheme"),
        pytest.param((("authorization", f"Bearer{TOKEN}"),), id="no-space"),
        pytest.param((("authorization", "Bearer "),), id="empty-token"),
        pytest.param((("x-token", TOKEN),), id="other-key"),
    ],
)
def test_every_other_caller_of_an_admin_rpc_is_unauthenticated(metadata):
    handler = intercept(RELOAD, *metadata)
    assert handler is not PASSED
    with pytest.raises(Aborted) as err:
        asyncio.run(handler.unary_unary(None, Context()))
    code, details = err.value.args
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert "authorization: Bearer <token>" in details and TOKEN not in details


def test_methods_outside_the_admin_service_pass_without_a_token():
    assert intercept("/recsys.v1.RankingService/Rank") is PASSED
    assert intercept("/recsys.v1.StatusService/Status", ("authorization", "Bearer wrong")) is PASSED
