"""The per-cluster clock-probe key: generated once, copied to every node, read from a 0600 file.

Every probe datagram carries a MAC made with this key (see `wire`), so only nodes holding it can send
probes an agent will use. There is no built-in key: without one the clock source stays off. A key file
must be a regular file (not a symlink), owned by the user running the agent (or root), unreadable by
group and others, and hold at least 32 bytes; its bytes, less surrounding whitespace, are the key.
`generate_key_file` writes 32 random bytes as 64 hex characters, so the file is easy to copy around.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from clocktower.runtime.private_file import create_private_file

MIN_KEY_BYTES = 32
ENV_VAR = "CLOCKTOWER_CLOCK_KEY_FILE"


class ClockKeyError(ValueError):
    """The key file is missing, too open, too short, or not a plain file; the message says which."""


def load_key(path: str | os.PathLike[str]) -> bytes:
    """The key in `path`, after checking the file is ours, a plain file, 0600 or tighter, and long enough."""
    where = str(path)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ClockKeyError(f"clock key file {where} does not exist (make one: clocktower agent "
                            f"--gen-clock-key {where}, then copy it to every node)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ClockKeyError(f"clock key file {where} is a symlink: refused") from None
        raise ClockKeyError(f"cannot open clock key file {where}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ClockKeyError(f"clock key file {where} is not a regular file")
        if st.st_uid not in (os.geteuid(), 0):
            raise ClockKeyError(f"clock key file {where} is owned by uid {st.st_uid}, not by us: refused")
        if st.st_mode & 0o077:
            raise ClockKeyError(f"clock key file {where} has mode {stat.S_IMODE(st.st_mode):04o}: "
                                f"others could read the key (chmod 600 {where})")
        data = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if len(data) < MIN_KEY_BYTES:
        raise ClockKeyError(f"clock key file {where} holds {len(data)} bytes, at least {MIN_KEY_BYTES} are needed")
    return data


def generate_key_file(path: str | os.PathLike[str]) -> Path:
    """Write a new random key to `path` (0600, never overwriting anything); returns the path."""
    target = Path(path)
    try:
        created = create_private_file(target, (secrets.token_hex(MIN_KEY_BYTES) + "\n").encode())
    except OSError as exc:
        raise ClockKeyError(f"cannot create clock key file {target}: {exc.strerror}") from None
    if not created:
        raise ClockKeyError(f"{target} already exists: not overwritten (remove it first to make a new key)")
    return target
