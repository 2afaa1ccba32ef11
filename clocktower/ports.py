"""Port checks, so a busy port fails with a clear line instead of a child's traceback."""

from __future__ import annotations

import socket
import time

from clocktower.runtime.errors import UserError


def ensure_free(host: str, port: int, what: str, flag: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            raise UserError(f"port {host}:{port} for {what} is in use: stop whatever uses it, "
                            f"or choose another with {flag}") from None


def wait_open(host: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex((host, port)) == 0:
                return True
        time.sleep(0.05)
    return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
