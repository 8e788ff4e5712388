"""The server's HTTP side: Prometheus ``/metrics`` and ``/status`` (the Status RPC as JSON) on one port.

Operators and load balancers often reach a service over plain HTTP only (a browser, curl, an HTTP
health check); the status answer there is the Status RPC's, in the proto3 JSON mapping that grpcurl
prints too, so both read the same. prometheus_client serves ``/metrics`` through its WSGI app, and its
threading WSGI server carries both paths, so a slow scrape never holds up a status read.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from google.protobuf import json_format
from google.protobuf.message import Message
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args) -> None:
        """Scrapes every few seconds would flood stderr; the server logs its own events."""


def start_http_endpoints(
    host: str, port: int, registry: CollectorRegistry, status: Callable[[], Message]
) -> WSGIServer:
    """Serve ``/status`` and (every other path) ``/metrics`` on a daemon thread; ``port`` 0: any free one."""
    metrics_app = make_wsgi_app(registry)

    def app(environ, start_response):
        if environ.get("PATH_INFO") != "/status":
            return metrics_app(environ, start_response)
        body = json.dumps(json_format.MessageToDict(status(), preserving_proto_field_name=True)).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    class Server(ThreadingWSGIServer):
        address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    server = make_server(host, port, app, Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="http-endpoints", daemon=True).start()
    return server
