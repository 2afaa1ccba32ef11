"""Spool files: planted links are never followed, files are private, and a failed write gives nothing up."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from clocktower.producers.spool import Spool, SpoolDirUnsafe, SpoolInUse, SpoolRecord, encode_frame


def _records(n: int, size: int = 200) -> list[SpoolRecord]:
    return [SpoolRecord(i + 1, "telemetry.links", b"node-a", b"[%03d]" % i + b"x" * size,
                        [("ct-schema", b"link_state"), ("ct-count", b"1")], 1_700_000_000_000 + i) for i in range(n)]


def _victim(tmp_path: Path, name: str) -> tuple[Path, bytes]:
    path = tmp_path / name
    path.write_bytes(b"precious " + name.encode())
    return path, path.read_bytes()


def _seqs(spool: Spool) -> list[int]:
    out, after = [], 0
    while (rec := spool.read_next(after)) is not None:
        out.append(rec.seq)
        after = rec.seq
    return out


def test_planted_link_at_next_segment_is_not_followed(tmp_path: Path) -> None:
    victim, before = _victim(tmp_path, "victim-seg")
    spool = Spool(tmp_path / "spool")
    (tmp_path / "spool" / "0000000001.seg").symlink_to(victim)       # the segment the first append creates
    for rec in _records(3):
        spool.append(rec)
    assert victim.read_bytes() == before
    assert _seqs(spool) == [1, 2, 3]
    spool.close()
    reopened = Spool(tmp_path / "spool")                              # the link is not read back as a segment
    assert _seqs(reopened) == [1, 2, 3] and reopened.corrupt_records == 0
    reopened.close()
    assert victim.read_bytes() == before


def test_planted_link_at_cursor_tmp_is_not_followed(tmp_path: Path) -> None:
    victim, before = _victim(tmp_path, "victim-cursor")
    spool = Spool(tmp_path / "spool")
    (tmp_path / "spool" / "cursor.tmp").symlink_to(victim)
    for rec in _records(3):
        spool.append(rec)
    assert spool.ack(1) and spool.ack(2)
    spool.sync()                                                      # writes the cursor through cursor.tmp
    assert victim.read_bytes() == before
    assert (tmp_path / "spool" / "cursor").read_text().strip() == "2"
    assert not (tmp_path / "spool" / "cursor").is_symlink()
    spool.close()
    reopened = Spool(tmp_path / "spool")
    assert _seqs(reopened) == [3]
    reopened.close()


def test_files_are_private_and_directory_is_0700(tmp_path: Path) -> None:
    d = tmp_path / "spool"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)                                                # an existing, too-open directory of ours
    spool = Spool(d)
    for rec in _records(2):
        spool.append(rec)
    spool.ack(1)
    spool.sync()
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    names = sorted(p.name for p in d.iterdir())
    assert "cursor" in names and any(n.endswith(".seg") for n in names)
    for p in d.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p.name
    spool.close()


def test_directory_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to hand a directory to another user (chown)")
    d = tmp_path / "spool"
    d.mkdir()
    os.chown(d, 65534, 65534)
    with pytest.raises(SpoolDirUnsafe, match="owned by uid 65534"):
        Spool(d)
    assert not list(d.iterdir()), "nothing is created in a refused directory"


def test_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    (tmp_path / "spool").symlink_to(real)
    with pytest.raises(SpoolInUse, match="not a plain directory"):   # SpoolDirUnsafe is a SpoolInUse
        Spool(tmp_path / "spool")
    assert not list(real.iterdir())


def test_full_disk_write_drops_nothing_already_spooled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recs = _records(12)
    frame = len(encode_frame(recs[0]))                               # every record here has this size
    spool = Spool(tmp_path / "spool", max_bytes=8 * frame + frame // 2, segment_bytes=2 * frame)
    for rec in recs[:8]:
        assert spool.append(rec) == []
    assert spool.bytes <= spool.max_bytes < spool.bytes + frame       # the next append needs room

    real_write = os.write
    calls = {"n": 0}

    def enospc_once(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", enospc_once)
    with pytest.raises(OSError) as exc:
        spool.append(recs[8])
    assert exc.value.errno == errno.ENOSPC
    assert _seqs(spool) == list(range(1, 9)), "a write that failed must not cost any record already spooled"
    assert spool.pending_records == 8

    dropped = spool.append(recs[9])                                   # the disk has room again
    assert [e.seq for e in dropped] and all(e.seq <= 2 for e in dropped)
    assert _seqs(spool) == [e for e in range(1, 9) if e > max(d.seq for d in dropped)] + [10]
    assert spool.bytes <= spool.max_bytes
    spool.close()
    reopened = Spool(tmp_path / "spool", max_bytes=8 * frame + frame // 2)
    assert _seqs(reopened)[-1] == 10 and 9 not in _seqs(reopened)
    reopened.close()
