"""A ClickHouse-compatible HTTP endpoint in front of the process's embedded engine.

chdb has no server mode and one process owns a data dir, so the owner serves
the part of ClickHouse's HTTP interface that clickhouse-connect, curl and
Grafana use; every other process reaches the data through it. Keep-alive
HTTP/1.1 with exact Content-Length matches urllib3's connection pooling.

Every query needs a user and password (sinks/endpoint/auth.py); /ping answers
anyone, and so do ``HEAD /ping`` and ``HEAD /`` (health checks; no query runs).
Responses are compressed as ClickHouse does (sinks/endpoint/response_encoding.py).
At most ``max_connections`` connections are served at once, each by one thread,
and each takes its slot when accepted (sinks/endpoint/connection_slots.py).
When all are taken, one gives way to a newcomer: first one that has sent nothing,
then one still sending headers that never authenticated, then an idle keep-alive
one; a connection that has authenticated is never closed mid-request. Request
line and headers must arrive within ``header_timeout_s`` of the first byte.
When every slot is in an authenticated request a newcomer waits ``BUSY_WAIT_S``,
then gets 503.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import ipaddress
import logging
import socket
import socketserver
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from clocktower.sinks.endpoint import response_encoding
from clocktower.sinks.endpoint.auth import Authenticator, OriginGuard, User
from clocktower.sinks.endpoint.connection_slots import ConnectionSlots
from clocktower.sinks.endpoint.engine import ChdbEngine
from clocktower.sinks.endpoint.errors import STD_EXCEPTION, TOO_MANY_SIMULTANEOUS_QUERIES, ClickHouseError
from clocktower.sinks.endpoint.limits import EndpointLimits
from clocktower.sinks.endpoint.protocol import ClickHouseProtocol, Reply
from clocktower.sinks.endpoint.request_body import RequestBody
from clocktower.sinks.endpoint.request_framing import framing_problem
from clocktower.sinks.endpoint.request_params import RequestParams, parse_params

logger = logging.getLogger(__name__)

KEEP_ALIVE_TIMEOUT_S = 30
BUSY_WAIT_S = 0.25
UNAUTHENTICATED_DRAIN_LIMIT = 1 << 20  # body bytes read past a refused request to keep its connection
_NOT_FOUND = (
    b"There is no handle {path}\n\nUse / or /ping for health checks.\n\n"
    b"Send queries from your program with POST method or GET /?query=...\n"
)


class PortInUse(OSError):
    """The endpoint's host:port is already bound, usually by another clocktower process."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], protocol: ClickHouseProtocol, authenticator: Authenticator,
                 max_connections: int, allowed_hosts: tuple[str, ...], header_timeout_s: float) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.protocol = protocol
        self.authenticator = authenticator
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        self.slots = ConnectionSlots(max_connections)
        self.header_timeout_s = header_timeout_s
        super().__init__(address, _Handler)
        self.origin_guard = OriginGuard(address[0], int(self.server_address[1]), allowed_hosts)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, which can stall on DNS; nothing here needs it.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        # One thread per connection, at most max_connections of them: never an unbounded number.
        if not self.slots.acquire(BUSY_WAIT_S):
            _refuse_busy(request, self.protocol.engine.version)
            self.shutdown_request(request)
            return
        with self.connections_lock:
            self.connections.add(request)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release(request)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that hang up mid-request are routine; never print tracebacks to stderr.
        logger.debug("connection from %s failed", client_address, exc_info=True)

    def drop_connections(self) -> None:
        """Wake handler threads parked on idle keep-alive connections so they exit."""
        with self.connections_lock:
            open_now = list(self.connections)
        for conn in open_now:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "clocktower-chdb"
    sys_version = ""
    timeout = KEEP_ALIVE_TIMEOUT_S
    disable_nagle_algorithm = True  # headers and body go out in separate writes; avoid the 40 ms stall
    server: _Server

    def handle_one_request(self) -> None:
        """Wait for the next request as an idle (reclaimable) connection, then read it under the header deadline.

        Sending a byte claims nothing: a connection that has never authenticated (``_dispatch``) stays
        reclaimable mid-headers; one that has is not, but is held to the header deadline all the same.
        """
        slots = self.server.slots
        slots.idle(self.connection)
        try:
            started = bool(self.rfile.peek(1))  # type: ignore[attr-defined]  # a BufferedReader
        except OSError:  # the keep-alive timeout, or a reset
            started = False
        if not started:
            self.close_connection = True
            return
        slots.started(self.connection, self.server.header_timeout_s)
        super().handle_one_request()

    def parse_request(self) -> bool:
        """The stdlib's parse, then the body's framing (request_framing.py): an ambiguous one is answered 400
        and the connection closed, so nothing after it on the connection is read as another request."""
        if not super().parse_request():
            return False
        problem = framing_problem(self.headers)
        if problem is not None:
            self.close_connection = True
            self.send_error(400, "Bad Request", problem)
            return False
        return True

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        """Health checks (``HEAD /ping``, ``HEAD /``): the GET answer's headers, no body, no query run."""
        try:
            self.server.origin_guard.check(self.headers)
        except ClickHouseError as ex:
            self._drain_and_send(None, self._error_reply(ex, None), UNAUTHENTICATED_DRAIN_LIMIT)
            return
        reply = self._static_reply(urlsplit(self.path).path, ok_paths=("/",))
        self._drain_and_send(None, reply, UNAUTHENTICATED_DRAIN_LIMIT)  # no login: the body is nobody's

    def do_POST(self) -> None:
        self._dispatch()

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        logger.debug("%s " + format, self.address_string(), *args)

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        protocol = self.server.protocol
        try:
            self.server.origin_guard.check(self.headers)
        except ClickHouseError as ex:
            self._drain_and_send(None, self._error_reply(ex, None), UNAUTHENTICATED_DRAIN_LIMIT)
            return
        if url.path != "/":  # /ping and 404s need no login, so their body is nobody's
            self._drain_and_send(None, self._static_reply(url.path), UNAUTHENTICATED_DRAIN_LIMIT)
            return
        pairs = parse_qsl(url.query, keep_blank_values=True)
        try:
            user = self.server.authenticator.authenticate(self.headers, pairs)
        except ClickHouseError as ex:
            self._drain_and_send(None, self._error_reply(ex, None), UNAUTHENTICATED_DRAIN_LIMIT)
            return
        if not self.server.slots.busy(self.connection):  # closed meanwhile to make room, or too slow
            self.close_connection = True
            return
        params: RequestParams | None = None
        body: RequestBody | None = None
        try:
            params = parse_params(pairs, self.headers)
            body = RequestBody(self.rfile, self.headers)
            reply = protocol.handle(self.command, params, body, self.headers.get("Content-Type", ""),
                                    readonly=user.readonly)
            compression = params.http_compression
            if compression or (compression is None and protocol.engine.http_compression):
                reply = _compressed(reply, self.headers.get("Accept-Encoding"), params.compression_level)
        except ClickHouseError as ex:
            reply = self._error_reply(ex, params)
        except Exception as ex:  # the server must survive anything a request triggers
            logger.exception("endpoint request failed")
            reply = self._error_reply(ClickHouseError(STD_EXCEPTION, f"{type(ex).__name__}: {ex}"), params)
        self._drain_and_send(body, reply)

    @staticmethod
    def _static_reply(path: str, ok_paths: tuple[str, ...] = ()) -> Reply:
        """The answer of a path that runs no query: health checks, or ClickHouse's 404 text."""
        if path in ("/ping", "/replicas_status", *ok_paths):
            return Reply(200, b"Ok.\n", {"Content-Type": "text/html; charset=UTF-8"})
        body = _NOT_FOUND.replace(b"{path}", path.encode(errors="replace"))
        return Reply(404, body, {"Content-Type": "text/plain; charset=UTF-8"})

    def _error_reply(self, ex: ClickHouseError, params: RequestParams | None) -> Reply:
        protocol = self.server.protocol
        headers = protocol.common_headers(params)
        headers["Content-Type"] = "text/plain; charset=UTF-8"
        headers["X-ClickHouse-Exception-Code"] = str(ex.code)
        return Reply(ex.http_status, ex.body(protocol.engine.version), headers)

    def _drain_and_send(self, body: RequestBody | None, reply: Reply, drain_limit: int = 256 << 20) -> None:
        if body is None:
            try:
                body = RequestBody(self.rfile, self.headers)
            except ClickHouseError:
                self.close_connection = True
        if body is not None and not body.exhausted and not body.drain(drain_limit):
            self.close_connection = True
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        else:
            self.send_header("Keep-Alive", f"timeout={KEEP_ALIVE_TIMEOUT_S}")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)


def _compressed(reply: Reply, accept_encoding: str | None, level: int | None) -> Reply:
    """``reply`` in the best encoding the client accepts (enable_http_compression=1 was sent); empty bodies as is."""
    encoding = response_encoding.choose(accept_encoding)
    if encoding is None or not reply.body:
        return reply
    headers = {**reply.headers, "Content-Encoding": encoding}
    return Reply(reply.status, response_encoding.compress(reply.body, encoding, level), headers)


def _refuse_busy(request: socket.socket, version: str) -> None:
    """Answer 503 on a connection no handler thread is free for, from the accepting thread."""
    error = ClickHouseError(TOO_MANY_SIMULTANEOUS_QUERIES, "Too many simultaneous connections to the embedded endpoint")
    text = error.body(version)
    head = (f"HTTP/1.1 {error.http_status} Service Unavailable\r\nContent-Type: text/plain; charset=UTF-8\r\n"
            f"X-ClickHouse-Exception-Code: {error.code}\r\nRetry-After: 1\r\n"
            f"Content-Length: {len(text)}\r\nConnection: close\r\n\r\n").encode()
    with contextlib.suppress(OSError):
        request.settimeout(0.1)
        request.sendall(head + text)
    logger.warning("endpoint busy: refused a connection (all handler slots in use)")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class ClickHouseHttpEndpoint:
    """Serves ``engine`` over ClickHouse's HTTP protocol from a daemon thread."""

    def __init__(self, engine: ChdbEngine, host: str = "127.0.0.1", port: int = 8123, *,
                 users: Mapping[str, User], max_connections: int = 32, allowed_hosts: tuple[str, ...] = (),
                 protocol: ClickHouseProtocol | None = None, header_timeout_s: float | None = None) -> None:
        self.engine = engine
        self.protocol = protocol or ClickHouseProtocol(engine)
        self.host = host
        self.port = port
        self.authenticator = Authenticator(users)
        self.max_connections = max_connections
        self.allowed_hosts = allowed_hosts
        if header_timeout_s is None:  # CLOCKTOWER_ENDPOINT_HEADER_TIMEOUT_S, with the engine's other limits
            header_timeout_s = (engine.limits if engine is not None else EndpointLimits()).header_timeout_s
        self.header_timeout_s = header_timeout_s
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ClickHouseHttpEndpoint:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Bind and serve; raises PortInUse when host:port is taken."""
        if self._server is not None:
            return
        try:
            server = _Server((self.host, self.port), self.protocol, self.authenticator,
                             self.max_connections, self.allowed_hosts, self.header_timeout_s)
        except OSError as ex:
            if ex.errno == errno.EADDRINUSE:
                message = f"cannot serve ClickHouse HTTP on {self.host}:{self.port}: port already in use"
                raise PortInUse(message) from None
            raise
        self.port = server.server_address[1]
        self._server = server
        if not _is_loopback(self.host):
            logger.warning("embedded ClickHouse serves %s beyond this machine: use TLS in front of it", self.url)
        name = f"clickhouse-http-{self.port}"
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name=name, daemon=True)
        self._thread.start()
        atexit.register(self.stop)  # before the engine closes (atexit runs in reverse order)

    def stop(self) -> None:
        """Stop accepting, close open connections and wait for the serving thread."""
        server, self._server = self._server, None
        if server is None:
            return
        atexit.unregister(self.stop)
        server.shutdown()
        server.server_close()
        server.drop_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
