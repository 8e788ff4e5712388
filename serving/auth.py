"""Token auth for admin RPCs: a server interceptor that lets no anonymous caller reach them.

The token comes from a file (never a flag: flags show in process lists). Callers send it as
``authorization: Bearer <token>`` metadata, the scheme in any case ("bearer" too: RFC 6750 takes it
from RFC 7235, where auth schemes are case-insensitive, and some clients lower-case it); the token's
comparison is constant-time. Without a token the server does not offer the admin service at all (see
``recsys_rl.serving.server``), so it is never open.
"""

from __future__ import annotations

import hmac
from pathlib import Path

import grpc

from recsys_rl.config import ConfigError

ADMIN_PREFIX = "/recsys.v1.AdminService/"
_SCHEME = "bearer"


def read_token(path: str) -> str:
    try:
        token = Path(path).read_text().strip()
    except OSError as err:
        raise ConfigError(f"cannot read auth_token_file {path!r}: {err.strerror}") from None
    if len(token) < 16:
        raise ConfigError(f"the token in {path!r} should have at least 16 characters, but has {len(token)}")
    return token


def _deny(message: str) -> grpc.RpcMethodHandler:
    async def abort(request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(abort)


class AdminTokenInterceptor(grpc.aio.ServerInterceptor):
    """Admin methods need the bearer token; every other method passes untouched."""

    def __init__(self, token: str) -> None:
        self._expected = token.encode()

    async def intercept_service(self, continuation, handler_call_details: grpc.HandlerCallDetails):
        if not handler_call_details.method.startswith(ADMIN_PREFIX):
            return await continuation(handler_call_details)
        sent = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        scheme, _, token = sent.partition(" ")  # credentials = auth-scheme 1*SP token (RFC 7235 2.1)
        token = token.lstrip(" ")
        if not hmac.compare_digest(token.encode(), self._expected) or scheme.lower() != _SCHEME:
            return _deny("admin RPCs need 'authorization: Bearer <token>' metadata with the server's token")
        return await continuation(handler_call_details)
