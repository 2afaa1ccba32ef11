"""streams/engine/faust_fixes.py through Faust's real consumer and the real embedded broker.

A Faust worker (tests/faust_drop_worker.py) reads a partition nobody has committed. Its first fetch of records is
met by a stopped flow, as when a rebalance starts while a fetch is in flight: Faust discards those records and
seeks back to the committed offsets. Upstream, that seek skips a partition with no commit, so the records are never
handed to the agent (issue 17, seen in the kill test of tests/test_scale_out.py); with the fix they all are.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rocksdict import Rdict

from tests.standalone_broker import StandaloneBroker, running

pytestmark = pytest.mark.e2e
RECORDS = 40
WORKER = Path(__file__).with_name("faust_drop_worker.py")
TABLE_WORKER = Path(__file__).with_name("faust_table_worker.py")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneBroker]:
    with running(tmp_path_factory.mktemp("faust-fixes") / "kafka") as b:
        yield b


def _stable(admin: AdminClient, group: str) -> bool:
    try:
        desc = admin.describe_consumer_groups([group])[group].result(10)
    except Exception:  # noqa: BLE001 - the group does not exist yet
        return False
    return str(desc.state).endswith("STABLE") and len(desc.members) == 1


def _committed(bootstrap: str, group: str, topic: str, want: int, wait_s: float) -> int | None:
    """The group's committed offset of `topic`:0 from the broker, once it is `want` or `wait_s` pass."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + wait_s
        while True:
            offset = reader.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
            committed = offset if offset >= 0 else None
            if committed == want or time.monotonic() > deadline:
                return committed
            time.sleep(0.3)
    finally:
        reader.close()


def _handed(broker: StandaloneBroker, tmp_path: Path, topic: str, fixes: str, race: str = "stop-flow",
            commit_wait_s: float = 15) -> tuple[list[int], str, int | None]:
    """The offsets the worker's agent was handed (duplicates included), its log, and the group's commit then (once
    it reaches every record, or after `commit_wait_s`: 0 where the test does not look at it)."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    out, log = tmp_path / "handed.json", tmp_path / "worker.log"
    with open(log, "wb") as log_file:
        worker = subprocess.Popen([sys.executable, str(WORKER), broker.bootstrap, topic, str(RECORDS), str(out), fixes,
                                   race], stdout=log_file, stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent)
    group = f"drop-test-{worker.pid}"
    try:
        deadline = time.monotonic() + 60
        while not _stable(admin, group):
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(RECORDS):
            producer.produce(topic, key=b"k", value=b"%d" % i)
        assert producer.flush(10) == 0
        deadline = time.monotonic() + 60
        while not out.exists():
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        committed = _committed(broker.bootstrap, group, topic, RECORDS, commit_wait_s)
    finally:
        worker.kill()
        worker.wait()
    text = log.read_text()
    assert " with offsets " in text or "rejoining the group" in text, text[-3000:]   # the injected race happened
    return json.loads(out.read_text()), text, committed


def test_records_discarded_on_a_never_committed_partition_are_read_again(broker: StandaloneBroker,
                                                                         tmp_path: Path) -> None:
    handed, log, committed = _handed(broker, tmp_path, "fixes-all", "all")
    assert sorted(set(handed)) == list(range(RECORDS)), log[-3000:]
    assert committed == RECORDS, log[-3000:]
    assert "was never committed and read up to" in log


def test_upstream_faust_loses_them_and_the_discard_report_says_so(broker: StandaloneBroker, tmp_path: Path) -> None:
    """Without the rewind (the report alone): the evidence of issue 17, and the WARNING that names it."""
    handed, log, _ = _handed(broker, tmp_path, "fixes-log-only", "log-only", commit_wait_s=0)
    # Offset 0 came in the discarded fetch; later records may have come in later fetches, and were handed on.
    assert 0 not in handed and len(set(handed)) < RECORDS, "upstream Faust read the discarded records again"
    assert "Faust discarded fixes-log-only:0 offsets 0-" in log
    assert "records of fixes-log-only:0 from offset 0 were discarded by Faust and not read again" in log



def test_records_a_seek_asks_for_again_mid_batch_are_all_handed_on_and_committed(broker: StandaloneBroker,
                                                                                  tmp_path: Path) -> None:
    """The second race: Faust's recovery seeks with flow running, while a batch is being handed on."""
    handed, log, committed = _handed(broker, tmp_path, "fixes-seek-all", "all", "seek-mid-batch")
    assert "seek while offset 10 is handed on" in log, log[-3000:]
    assert sorted(set(handed)) == list(range(RECORDS)), log[-3000:]
    assert committed == RECORDS, log[-3000:]
    assert "a seek since the fetch asked for them again" in log   # the rest of the stale batch was not handed on


def test_without_the_skip_the_seek_mid_batch_loses_what_the_agent_had_not_taken(broker: StandaloneBroker,
                                                                                tmp_path: Path) -> None:
    handed, log, committed = _handed(broker, tmp_path, "fixes-seek-no-skip", "no-skip", "seek-mid-batch")
    assert "seek while offset 10 is handed on" in log, log[-3000:]
    assert not set(range(10)) <= set(handed), "the queued records were read again: is the second fix still needed?"
    assert committed != RECORDS


def test_acked_records_are_committed_before_a_revoke_forgets_them(broker: StandaloneBroker, tmp_path: Path) -> None:
    handed, log, committed = _handed(broker, tmp_path, "fixes-revoke-all", "all", "revoke")
    assert "rejoining the group" in log, log[-3000:]
    assert sorted(handed) == list(range(RECORDS)), log[-3000:]   # each once: none read again after the rebalance
    assert committed == RECORDS


def test_without_the_commit_a_revoke_has_every_acked_record_read_again(broker: StandaloneBroker,
                                                                       tmp_path: Path) -> None:
    handed, log, _ = _handed(broker, tmp_path, "fixes-revoke-no-commit", "no-revoke-commit", "revoke", commit_wait_s=0)
    assert "rejoining the group" in log, log[-3000:]
    assert sorted(set(handed)) == list(range(RECORDS)) and len(handed) == 2 * RECORDS, log[-3000:]


def _table_worker(broker: StandaloneBroker, topic: str, datadir: Path, fixes: str, log: Path) -> subprocess.Popen:
    with open(log, "ab") as log_file:
        return subprocess.Popen([sys.executable, str(TABLE_WORKER), broker.bootstrap, topic, str(datadir), fixes],
                                stdout=log_file, stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent)


def _wait_for(worker: subprocess.Popen, log: Path, text: str, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        if worker.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _store_ahead_of_its_changelog(broker: StandaloneBroker, tmp_path: Path, fixes: str) -> tuple[bool, str]:
    """Count 10 records into a rocksdb table, stop, move the store's persisted changelog offset past the
    changelog's end (what a broker that lost records in a kill -9 leaves), start again and count one more.
    Whether the 11th was counted, and the second run's log."""
    topic = f"table-in-{fixes}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for name in (topic, "table-test-counts-changelog"):
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(10)
    datadir, first_log, second_log = tmp_path / "faust", tmp_path / "first.log", tmp_path / "second.log"
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    worker = _table_worker(broker, topic, datadir, fixes, first_log)
    try:
        for _ in range(10):
            producer.produce(topic, key=b"k", value=b"x")
        assert producer.flush(10) == 0
        assert _wait_for(worker, first_log, "counted k 10"), first_log.read_text()[-3000:]
        time.sleep(3)   # the changelog records sent and their offset persisted in the store
    finally:
        worker.terminate()
        worker.wait(30)
    (db_path,) = datadir.rglob("counts-0.db")
    db = Rdict(str(db_path))
    assert db.get(b"__faust\0offset__") is not None, "the store persisted no changelog offset"
    db[b"__faust\0offset__"] = b"100000"
    db.close()
    worker = _table_worker(broker, topic, datadir, fixes, second_log)
    try:
        producer.produce(topic, key=b"k", value=b"x")
        assert producer.flush(10) == 0
        return _wait_for(worker, second_log, "counted k 11"), second_log.read_text()
    finally:
        if worker.poll() is None:
            worker.terminate()
            worker.wait(30)


def test_a_store_ahead_of_its_changelog_is_dropped_and_recovered(tmp_path: Path) -> None:
    """Issue 18: after a broker kill -9, a worker whose store was ahead of the changelog crash-looped on
    ConsistencyError. Its own broker: the app id and changelog are fixed."""
    with running(tmp_path / "kafka") as broker:
        counted, log = _store_ahead_of_its_changelog(broker, tmp_path, "all")
    assert counted, log[-3000:]
    assert "past the changelog's last offset" in log and "dropped, recovering it from the changelog" in log


def test_upstream_faust_crashes_on_a_store_ahead_of_its_changelog(tmp_path: Path) -> None:
    with running(tmp_path / "kafka") as broker:
        counted, log = _store_ahead_of_its_changelog(broker, tmp_path, "none")
    assert not counted and "ConsistencyError" in log, log[-3000:]
