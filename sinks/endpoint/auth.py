"""Who may use the endpoint: the caller's user and password, and where the request came from.

Anyone who can reach the port, a web page in a local browser included, could otherwise read and
write every table. So every query needs a known user and its password, taken the ways ClickHouse
clients send them (HTTP Basic from clickhouse-connect and curl -u, X-ClickHouse-User/-Key headers,
user/password URL parameters). Requests must name this endpoint in Host (a DNS-rebound name does
not), and browsers' cross-origin requests (Origin, Sec-Fetch-Site) are refused.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from clocktower.sinks.endpoint.errors import ACCESS_DENIED, AUTHENTICATION_FAILED, ClickHouseError

_WILDCARDS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class User:
    """One login; ``readonly`` users run every query with readonly=1."""

    password: str
    readonly: bool


class AuthenticationFailed(ClickHouseError):
    """Code 516 with HTTP 403, as ClickHouse's HTTP handler answers a wrong user or password."""

    def __init__(self, user: str) -> None:
        message = f"{user}: Authentication failed: password is incorrect, or there is no user with such name"
        super().__init__(AUTHENTICATION_FAILED, message, "AUTHENTICATION_FAILED")

    @property
    def http_status(self) -> int:
        return 403


class AccessDenied(ClickHouseError):
    """Code 497 with HTTP 403: the request's Host or Origin is not this endpoint."""

    def __init__(self, message: str) -> None:
        super().__init__(ACCESS_DENIED, message, "ACCESS_DENIED")

    @property
    def http_status(self) -> int:
        return 403


class Authenticator:
    """Checks a request's credentials against the configured users, in constant time."""

    def __init__(self, users: Mapping[str, User]) -> None:
        if not users:
            raise ValueError("the endpoint needs at least one user")
        self._users = dict(users)
        self._dummy = "x" * 32  # compared against when the user is unknown, so timing does not tell

    def authenticate(self, headers: Mapping[str, str], query: Iterable[tuple[str, str]]) -> User:
        """The caller's user; AuthenticationFailed unless exactly one known user and its password were sent."""
        offered = _offered_logins(headers, query)
        name, password = offered.pop() if len(offered) == 1 else ("default", "")
        user = self._users.get(name)
        expected = user.password if user is not None else self._dummy
        matches = hmac.compare_digest(password.encode(), expected.encode())
        if user is None or not matches or offered:
            raise AuthenticationFailed(name)
        return user


def _offered_logins(headers: Mapping[str, str], query: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
    """Every (user, password) the request carries; clients send one, and two different ones are refused."""
    logins: set[tuple[str, str]] = set()
    auth = headers.get("Authorization")
    if auth is not None:
        scheme, _, token = auth.strip().partition(" ")
        try:
            user, sep, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            user, sep, password = "", "", ""
        logins.add((user, password) if scheme.lower() == "basic" and sep else ("?", "?"))
    header_user = headers.get("X-ClickHouse-User")
    if header_user is not None or headers.get("X-ClickHouse-Key") is not None:
        logins.add((header_user or "default", headers.get("X-ClickHouse-Key") or ""))
    params = dict(query)
    if "user" in params or "password" in params:
        logins.add((params.get("user") or "default", params.get("password", "")))
    if len(logins) > 1:
        logins.add(("?", "?"))  # conflicting credentials: refused, as ClickHouse refuses mixed methods
    return logins


class OriginGuard:
    """Refuses requests whose Host is not this endpoint, and cross-origin requests from browsers."""

    def __init__(self, bound_host: str, port: int, allowed_hosts: Iterable[str] = ()) -> None:
        self.port = port
        self.any_address = bound_host in _WILDCARDS
        self.hosts = {"localhost", "127.0.0.1", "::1", bound_host.lower(), *(h.lower() for h in allowed_hosts)}

    def check(self, headers: Mapping[str, str]) -> None:
        """Raise AccessDenied unless Host names this endpoint and no browser marks the request cross-origin."""
        host = headers.get("Host")
        if host is None or not self._host_allowed(host.strip().lower()):
            raise AccessDenied(f"Host header {host!r} does not name this server (port {self.port})")
        origin = headers.get("Origin")
        if origin is not None and origin.strip().lower().rstrip("/") != f"http://{host.strip().lower()}":
            raise AccessDenied(f"cross-origin request from {origin!r} refused")
        fetch_site = headers.get("Sec-Fetch-Site")
        if fetch_site is not None and fetch_site.strip().lower() not in ("same-origin", "none"):
            raise AccessDenied(f"{fetch_site} request from a browser refused")

    def _host_allowed(self, host: str) -> bool:
        name, port = _split_host(host)
        if port != self.port:
            return False
        if name in self.hosts:
            return True
        if not self.any_address:
            return False
        try:
            ipaddress.ip_address(name)  # bound to every interface: any address literal, never a DNS name
        except ValueError:
            return False
        return True


def _split_host(host: str) -> tuple[str, int | None]:
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port_text = host.partition(":")
    if not port_text:
        return name, 80
    return name, int(port_text) if port_text.isdigit() else None
