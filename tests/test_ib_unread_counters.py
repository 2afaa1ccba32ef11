"""An IB counter that cannot be read is null end to end (agent, codec, ClickHouse), never a fake 0.

A 0 is a real reading (no symbol errors); a counter file that is missing or unreadable must not look like one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from clocktower.producers.agent import ib_sysfs
from clocktower.producers.agent.ib_sysfs import KEEP_UNREAD_POLLS, IbPortSource, read_ports
from clocktower.schemas.clickhouse_ddl import create_table_sql
from clocktower.schemas.codec import H_COUNT, H_SCHEMA, H_VERSION, decode_batch
from clocktower.schemas.columns import model_columns
from clocktower.schemas.telemetry import LinkState
from clocktower.schemas.topics import BY_MODEL
from tests.test_agent_links import FULL, make_port

IB_COUNTERS = tuple(FULL)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """One port whose symbol_error cannot be read (a directory, like a file the kernel refuses) and whose
    link_downed is missing; every other counter reads 0 or more."""
    root = tmp_path / "infiniband"
    port = make_port(root, "mlx5_0", 1, counters={k: v for k, v in FULL.items()
                                                  if k not in ("symbol_error", "link_downed")} | {"port_rcv_errors": 0})
    (port / "counters" / "symbol_error").mkdir()
    return root


def test_unreadable_counter_is_none_and_zero_stays_zero(root: Path) -> None:
    (port,) = read_ports(root)
    assert port.counters["symbol_error"] is None and port.counters["link_downed"] is None
    assert port.counters["port_rcv_errors"] == 0 and port.counters["port_xmit_data"] == 4000
    ev = port.to_event("node-3", 10**18)
    assert (ev.symbol_error, ev.link_downed, ev.port_rcv_errors) == (None, None, 0)


def test_why_is_logged_once_per_counter(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = IbPortSource("node-3", root=root)
    with caplog.at_level(logging.WARNING, logger="clocktower.producers.agent.ib_sysfs"):
        for t in range(3):
            src.poll(now=float(t))
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if "symbol_error" in m]) == 1 and "unreadable" in lines[0] + lines[-1]
    assert len([m for m in lines if "link_downed" in m and "missing" in m]) == 1
    assert len(lines) == 2


def test_carrier_changes_keeps_last_link_downed_while_unread(root: Path) -> None:
    """carrier_changes cannot be null (Ethernet shares it): an unread poll must not look like a counter reset."""
    downed = root / "mlx5_0" / "ports" / "1" / "counters" / "link_downed"
    src = IbPortSource("node-3", root=root)
    assert [(e.carrier_changes, e.link_downed) for e in src.poll(now=0.0)] == [(0, None)]
    downed.write_text("7\n")
    assert [(e.carrier_changes, e.link_downed) for e in src.poll(now=1.0)] == [(7, 7)]
    downed.unlink()
    assert [(e.carrier_changes, e.link_downed) for e in src.poll(now=2.0)] == [(7, None)]


def test_a_state_file_that_fails_one_poll_keeps_the_state_before(root: Path, caplog: pytest.LogCaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A read that fails for a moment (EIO in a driver reset; here the file is gone) is not a down and an up:
    the port keeps the state of the poll before, no state change is counted, and why is logged once."""
    monkeypatch.setattr(ib_sysfs, "_warned", set())     # logged once per process: not by an earlier test
    state = root / "mlx5_0" / "ports" / "1" / "state"
    src = IbPortSource("node-3", root=root)
    assert [(e.up, e.ib_state) for e in src.poll(now=0.0)] == [(True, "ACTIVE")]
    saved = state.read_text()
    state.unlink()
    with caplog.at_level(logging.WARNING, logger="clocktower.producers.agent.ib_sysfs"):
        assert [(e.up, e.ib_state) for e in src.poll(now=1.0)] == [(True, "ACTIVE")]
        assert [(e.up, e.ib_state) for e in src.poll(now=2.0)] == [(True, "ACTIVE")]
    assert src.state_changes == 0
    assert len([r for r in caplog.records if "could not read state" in r.getMessage()]) == 1
    state.write_text("1: DOWN\n")
    assert [(e.up, e.ib_state) for e in src.poll(now=3.0)] == [(False, "DOWN")] and src.state_changes == 1
    state.unlink()                              # with no poll before, an unread state is "unknown": not up
    assert [(e.up, e.ib_state) for e in IbPortSource("node-4", root=root).poll(now=0.0)] == [(False, "unknown")]
    state.write_text(saved)


def test_a_state_file_that_stays_unreadable_is_reported_not_up(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept for KEEP_UNREAD_POLLS polls only: a port whose state cannot be read for longer is not reported healthy."""
    monkeypatch.setattr(ib_sysfs, "_warned", set())
    (root / "mlx5_0" / "ports" / "1" / "state").unlink()
    src = IbPortSource("node-3", root=root)
    src._last = {p.name: replace(p, state="ACTIVE") for p in read_ports(root)}   # noqa: SLF001 - read as up before
    ups = [[e.up for e in src.poll(now=float(t))] for t in range(KEEP_UNREAD_POLLS + 2)]
    assert ups == [[True]] * KEEP_UNREAD_POLLS + [[False], [False]] and src.state_changes == 1


def _record(events: list[LinkState]) -> tuple[bytes, bytes, list]:
    headers = [(H_SCHEMA, b"link_state"), (H_VERSION, b"1"), (H_COUNT, str(len(events)).encode())]
    return b"node-3", orjson.dumps([e.model_dump(mode="json") for e in events]), headers


def test_unread_counter_decodes_as_null_and_is_still_required(root: Path) -> None:
    ev = read_ports(root)[0].to_event("node-3", time.time_ns())
    key, value, headers = _record([ev])
    assert orjson.loads(value)[0]["symbol_error"] is None
    (back,) = decode_batch("telemetry.links", key, value, headers).events
    assert back == ev and back.symbol_error is None and back.port_rcv_errors == 0
    dropped = [{k: v for k, v in orjson.loads(value)[0].items() if k != "symbol_error"}]
    with pytest.raises(Exception, match="required when kind is 'infiniband'"):
        decode_batch("telemetry.links", key, orjson.dumps(dropped), headers)


def test_link_state_columns_are_nullable() -> None:
    types = {c.name: c.ch_type for c in model_columns(LinkState)}
    assert all(types[k] == "Nullable(UInt64)" for k in IB_COUNTERS)
    assert types["carrier_changes"] == "UInt64"


def test_old_link_state_table_is_upgraded_and_stores_null_not_zero(root: Path, tmp_path: Path) -> None:
    """A link_state table made before the counters were nullable would store null as 0; the sink upgrades it."""
    from clocktower.sinks.clickhouse.batch_set import BatchSet
    from clocktower.sinks.clickhouse.table_writer import TableWriter
    from tests.conftest import start_services

    old_ddl = create_table_sql(BY_MODEL[LinkState])[0].replace("Nullable(UInt64)", "UInt64")
    services = start_services(tmp_path / "ct")
    try:
        client = services.client
        client.command(old_ddl)
        writer = TableWriter(client)
        writer.ensure_schema()
        types = dict(client.query("SELECT name, type FROM system.columns WHERE table = 'link_states'").result_rows)
        assert types["symbol_error"] == "Nullable(UInt64)" and types["carrier_changes"] == "UInt64"
        ev = read_ports(root)[0].to_event("node-3", time.time_ns())
        batches = BatchSet()
        batches.add("telemetry.links", 0, 0, [ev])
        writer.insert(batches.take()[0][0])
        rows = client.query("SELECT symbol_error, link_downed, port_rcv_errors, port_xmit_data FROM link_states"
                            ).result_rows
        assert rows == [(None, None, 0, 4000)]
    finally:
        services.stack.stop()
