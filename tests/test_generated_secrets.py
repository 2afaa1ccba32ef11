"""No built-in keys or passwords: the data dir's generated secrets, its 0700 mode, and who reads them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from clocktower.child_process import ChildProcess
from clocktower.config import Settings
from clocktower.data_dir import DataDirLock, checked_data_dir, private_subdirs
from clocktower.generated_secrets import ensure_secrets
from clocktower.runtime.credentials import (
    ADMIN_USER,
    DASHBOARDS_USER,
    control_key_path,
    credentials_path,
    read_control_key,
    read_users,
)
from clocktower.runtime.errors import UserError
from clocktower.runtime.owner_note import write_owner
from clocktower.runtime.private_file import create_private_file


def mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o777


@pytest.fixture(autouse=True)
def _no_clocktower_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("CLOCKTOWER_"):
            monkeypatch.delenv(name)


def test_first_start_writes_private_random_secrets_and_never_rewrites_them(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    for d in (one, two):
        ensure_secrets(d)
    assert mode(one) == 0o700 and mode(credentials_path(one)) == 0o600 and mode(control_key_path(one)) == 0o600
    users = read_users(credentials_path(one))
    assert users[ADMIN_USER][1] is False and users[DASHBOARDS_USER][1] is True
    assert len(users[ADMIN_USER][0]) >= 24 and users[ADMIN_USER][0] != users[DASHBOARDS_USER][0]
    assert read_users(credentials_path(two)) != users, "two data dirs got the same passwords"
    key = read_control_key(one)
    assert key is not None and key.startswith(b"-----BEGIN PRIVATE KEY-----") and key != read_control_key(two)
    before = credentials_path(one).read_bytes(), control_key_path(one).read_bytes()
    ensure_secrets(one)  # a restart
    assert (credentials_path(one).read_bytes(), control_key_path(one).read_bytes()) == before


def test_planted_symlinks_are_neither_written_through_nor_trusted(tmp_path: Path) -> None:
    data_dir, victim = tmp_path / "ct", tmp_path / "victim"
    data_dir.mkdir(mode=0o700)
    victim.write_text("keep me")
    os.chmod(victim, 0o600)
    credentials_path(data_dir).symlink_to(victim)
    ensure_secrets(data_dir)
    assert victim.read_text() == "keep me"
    with pytest.raises(UserError, match="cannot read"):
        read_users(credentials_path(data_dir))


def test_secrets_readable_by_others_are_refused(tmp_path: Path) -> None:
    ensure_secrets(tmp_path / "ct")
    path = credentials_path(tmp_path / "ct")
    os.chmod(path, 0o644)
    with pytest.raises(UserError, match="readable by other users"):
        read_users(path)


def test_settings_carry_no_built_in_key_and_read_the_generated_one(tmp_path: Path) -> None:
    assert Settings.model_fields["control_private_key_file"].default is None
    assert Settings.model_fields["clickhouse_password"].default is None
    settings = Settings(data_dir=tmp_path / "ct")
    with pytest.raises(UserError, match="no control signing key"):
        settings.control_private_key_pem()
    ensure_secrets(tmp_path / "ct")
    assert settings.control_private_key_pem() == (read_control_key(tmp_path / "ct"), control_key_path(tmp_path / "ct"))
    own = tmp_path / "own.key"
    create_private_file(own, b"-----BEGIN PRIVATE KEY-----")
    assert Settings(data_dir=tmp_path / "ct", control_private_key_file=own).control_private_key_pem()[1] == own


def test_clickhouse_login_prefers_explicit_settings_then_the_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "ct"
    assert Settings(data_dir=data_dir).clickhouse_login() == ("default", "")  # nothing generated yet
    ensure_secrets(data_dir)
    generated = json.loads(credentials_path(data_dir).read_text())["users"][ADMIN_USER]["password"]
    assert Settings(data_dir=data_dir).clickhouse_login() == (ADMIN_USER, generated)
    assert Settings(data_dir=data_dir, clickhouse_user="u", clickhouse_password="p").clickhouse_login() == ("u", "p")
    external = "http://10.9.9.9:8123"
    assert Settings(data_dir=data_dir, clickhouse_url=external).clickhouse_login() == ("default", "")
    write_owner(data_dir, {"clickhouse": external, "clickhouse_embedded": False})  # `up` with an external one
    assert Settings(data_dir=data_dir, clickhouse_url=external).clickhouse_login() == ("default", "")
    write_owner(data_dir, {"clickhouse": "http://127.0.0.1:18123", "clickhouse_embedded": True})  # `up` serves it
    assert Settings(data_dir=data_dir, clickhouse_url="http://127.0.0.1:18123").clickhouse_login() == (
        ADMIN_USER, generated)  # the sink, spawned by `up` with the endpoint's URL
    assert Settings(data_dir=data_dir, clickhouse_url=external).clickhouse_login() == ("default", "")


def test_the_data_dir_is_made_0700(tmp_path: Path) -> None:
    fresh, existing = tmp_path / "fresh", tmp_path / "existing"
    existing.mkdir(mode=0o755)
    os.chmod(existing, 0o755)
    for d in (fresh, existing):
        lock = DataDirLock(d)
        lock.acquire()
        lock.release()
        assert mode(d) == 0o700, d
    assert mode(fresh / "clocktower.lock") == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_data_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chmod(theirs, 0o777)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(UserError, match="belongs to uid 65534"):
        DataDirLock(theirs).acquire()
    assert mode(theirs) == 0o777 and not (theirs / "clocktower.lock").exists()  # left as it was


# -- issue 18 finding 10: the data dir and what is planted in it ------------------------------------------------

def test_a_data_dir_given_as_a_symlink_is_refused_before_it_is_resolved(tmp_path: Path) -> None:
    """`up --data-dir LINK` made the link's target 0700 and filled it with secrets (with root and /etc, fatal)."""
    target = tmp_path / "etc-like"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(UserError, match="is a symlink"):
        checked_data_dir(tmp_path / "link")
    assert mode(target) == 0o755 and list(target.iterdir()) == []
    assert checked_data_dir(target) == target.resolve()


def test_a_planted_subdir_symlink_is_refused(tmp_path: Path) -> None:
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    data.mkdir()
    elsewhere.mkdir()
    (data / "logs").symlink_to(elsewhere)
    with pytest.raises(UserError, match="logs is not a directory"):
        private_subdirs(data)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_planted_subdir_of_another_user_is_refused(tmp_path: Path) -> None:
    """The broker once used a `kafka/` dir planted in a 0777 data dir by another user."""
    data = tmp_path / "data"
    (data / "kafka").mkdir(parents=True)
    os.chown(data / "kafka", 65534, 65534)
    with pytest.raises(UserError, match="belongs to uid 65534"):
        private_subdirs(data)


def test_a_planted_log_symlink_is_never_written_through(tmp_path: Path) -> None:
    """A planted `logs/broker.log` symlink had the broker's log appended to its target."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "broker.log").symlink_to(victim)
    child = ChildProcess("broker", [sys.executable, "-c", "print('log line')"], tmp_path / "logs" / "broker.log")
    with pytest.raises(UserError, match="cannot open the log"):
        child.start()
    assert victim.read_bytes() == b"precious\n" and child.proc is None


def test_a_log_is_created_private_and_appended(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "sink.log"
    for _ in range(2):
        child = ChildProcess("sink", [sys.executable, "-c", "print('log line')"], log)
        child.start()
        assert child.proc is not None and child.proc.wait(10) == 0
    assert log.read_text() == "log line\nlog line\n" and mode(log) == 0o600 and mode(log.parent) == 0o700
