"""The failover proof, end to end: two hosts (network namespaces) joined by a primary and a backup veth pair
(tests/failover_bed.py), each running the real node agent (`clocktower agent --actuate --sources links` in
the root namespace, watching and routing inside its host's through CLOCKTOWER_AGENT_NETNS), with the real
broker, stream workers and sink. A long-lived TCP stream between the hosts' service addresses checks every
byte's sequence at the receiver.

The primary flaps three times, and the traffic must stay up: the agents' own watchdogs (T_watchdog 50 ms)
move the routes to the backup, the pipeline opens an incident, orders the failover (already done: applied
as a no-op) and, once the primary has been stable for T_stable, the restore that moves the traffic back.
Then the primary goes down hard for 20 s (the kernel deletes the routes through it) and comes back: on the
backup within the watchdog's time, back on the primary only after T_stable.

T_stable is 3 s here (CLOCKTOWER_STREAMS_LINK_STABLE_S; 10 s by default) to keep the test short; the agents
report every link every 0.2 s (CLOCKTOWER_AGENT_LINK_REPORT_S) so the pipeline sees the stability promptly.
Asserted: no stream error and no lost or reordered byte; the moves seen on the wire (rx counters); and in
ClickHouse the incidents, both hosts' failover and restore commands, an `applied` ack for every command,
and the watchdogs' own `applied` acks (origin 'watchdog').
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from clocktower.runtime.credentials import control_public_key_path
from tests.conftest import Pipeline, start_pipeline
from tests.failover_bed import BACKUP, HOSTS, PRIMARY, FailoverBed, failover_bed

pytestmark = pytest.mark.e2e

STABLE_S = 3.0          # T_stable for this test (CLOCKTOWER_STREAMS_LINK_STABLE_S)
HARD_DOWN_S = 20.0
FLAPS = 3


@pytest.fixture
def bed() -> Iterator[FailoverBed]:
    with failover_bed("fe2e") as b:
        yield b


def _pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watchdog_ms: int) -> Iterator[Pipeline]:
    # the stream workers inherit the environment (Stack's children copy os.environ)
    monkeypatch.setenv("CLOCKTOWER_STREAMS_LINK_STABLE_S", str(STABLE_S))
    monkeypatch.setenv("CLOCKTOWER_STREAMS_LINK_WATCHDOG_MS", str(watchdog_ms))
    p = start_pipeline(tmp_path / "ct")
    try:
        yield p
    finally:
        p.stack.stop()


@pytest.fixture
def fast_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bed: FailoverBed) -> Iterator[Pipeline]:
    yield from _pipeline(tmp_path, monkeypatch, 50)


def _poll(pipeline: Pipeline, sql: str, done, timeout_s: float) -> list:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    rows: list = []
    while time.monotonic() < deadline:
        try:
            rows = pipeline.client.query(sql).result_rows
        except DatabaseError:            # the sink creates its tables as it starts: ask again
            rows = []
        if done(rows):
            return rows
        pipeline.stack.supervise()
        time.sleep(0.3)
    return rows


def _on(bed: FailoverBed, link: str) -> bool:
    return all(bed.route_to_peer(host)[0] == link for host in HOSTS)


def _wait_route(bed: FailoverBed, link: str, timeout_s: float) -> float | None:
    """Seconds until both hosts route to their peer via `link`, or None after `timeout_s`."""
    start = time.monotonic()
    while not _on(bed, link):
        if time.monotonic() - start > timeout_s:
            return None
        time.sleep(0.02)
    return time.monotonic() - start


def _up_and_wait(bed: FailoverBed) -> None:
    bed.hard_up()
    for host in HOSTS:
        bed.wait_carrier(host, PRIMARY, True)


def _wait_reported_up(p: Pipeline, in_nodes: str, condition: str = "") -> None:
    """Both hosts' reports of their primary up are in ClickHouse."""
    seen = _poll(p, f"SELECT DISTINCT node FROM link_states WHERE node IN {in_nodes} AND interface = 'pri' "
                    f"AND up {condition}", lambda rows: len(rows) == 2, 60)
    assert len(seen) == 2, f"link reports ({condition or 'up'}) did not reach ClickHouse: {seen}"


def _up_then_restored_after_t_stable(bed: FailoverBed, stream, agents: dict, what: str) -> None:  # noqa: ANN001
    """The primary comes back; both hosts route over it again, not before T_stable, and the stream flows."""
    _up_and_wait(bed)
    up_at = time.monotonic()
    back = _wait_route(bed, PRIMARY, 30)
    assert back is not None, f"{what}: {[bed.route_to_peer(h) for h in HOSTS]}"
    assert time.monotonic() - up_at >= STABLE_S - 0.5, "restored before T_stable"
    stream.wait_bytes(stream.received + 100_000)
    assert all(a.alive() for a in agents.values()), "an agent died"


def test_flaps_and_a_hard_down_fail_over_and_back_without_the_tcp_stream_noticing(
        bed: FailoverBed, fast_pipeline: Pipeline, tmp_path: Path) -> None:
    p = fast_pipeline
    nodes = {host: bed.node(host) for host in HOSTS}
    in_nodes = "(" + ",".join(f"'{n}'" for n in nodes.values()) + ")"
    with (bed.real_agents(p.settings.bootstrap, tmp_path / "agents", control_public_key_path(p.settings.data_dir),
                          watchdog_ms=50, report_s=0.2) as agents,
          bed.stream() as stream):
        _wait_reported_up(p, in_nodes)     # the detector acts on a link it has seen up
        stream.wait_bytes(200_000)

        # 1. flaps: the watchdogs move the traffic to the backup at the first down, and it stays there
        flap_ns = time.time_ns()
        for _ in range(FLAPS):
            bed.hard_down()
            time.sleep(0.3)
            _up_and_wait(bed)
            time.sleep(0.3)
        assert bed.monitor.flow_start("b", BACKUP, after_ns=flap_ns, timeout_s=5) is not None, "no traffic on bkp"
        stable_from = time.monotonic()
        assert _on(bed, BACKUP), [bed.route_to_peer(h) for h in HOSTS]
        back = _wait_route(bed, PRIMARY, 30)
        assert back is not None, f"not restored to the primary: {[bed.route_to_peer(h) for h in HOSTS]}"
        assert time.monotonic() - stable_from >= STABLE_S - 0.5, "restored before T_stable"
        restore_ns = time.time_ns()
        assert bed.monitor.flow_start("b", PRIMARY, after_ns=restore_ns - int(0.5e9), timeout_s=5) is not None

        # 2. a hard down for 20 s: on the backup at once, back on the primary T_stable after it comes up
        time.sleep(1.0)
        down_ns = time.time_ns()
        bed.hard_down()
        on_backup = bed.monitor.flow_start("b", BACKUP, after_ns=down_ns, timeout_s=5)
        assert on_backup is not None, "the hard down did not move the traffic to the backup"
        assert (on_backup - down_ns) / 1e6 < 1000, f"failover took {(on_backup - down_ns) / 1e6:.0f} ms"
        time.sleep(HARD_DOWN_S)
        stream.wait_bytes(stream.received + 100_000)          # still flowing, on the backup
        assert _on(bed, BACKUP)
        _up_then_restored_after_t_stable(bed, stream, agents, "not restored after the hard down")
    result = stream.result
    assert result is not None and result.ok, (result, "lost/reordered bytes or a socket error")
    assert result.received == result.sent > 1_000_000
    for agent in agents.values():
        assert agent.report is not None, agent.log()
        assert agent.report["watchdog"]["failovers"] >= 2 and agent.report["watchdog"]["failures"] == 0, agent.report

    # what landed in ClickHouse: incidents, commands (failover, restore per host and episode), acks for all
    cmds = _poll(p, f"SELECT command_id, node, action FROM control_commands FINAL WHERE node IN {in_nodes}",
                 lambda rows: sum(r[2] == "restore" for r in rows) >= 4, 60)
    for node in nodes.values():
        actions = sorted(r[2] for r in cmds if r[1] == node)
        assert actions == ["failover", "failover", "restore", "restore"], (node, actions)
    ids = {r[0] for r in cmds}
    acks = _poll(p, f"SELECT command_id, node, status, origin, action, detail FROM control_acks "
                    f"WHERE node IN {in_nodes}",
                 lambda rows: ids <= {r[0] for r in rows if r[3] == "command"}, 60)
    acked = {r[0]: r for r in acks if r[3] == "command"}
    assert ids <= set(acked), f"commands without an ack: {ids - set(acked)}"
    assert all(acked[i][2] == "applied" for i in ids), [acked[i] for i in ids if acked[i][2] != "applied"]
    for node in nodes.values():
        local = [r for r in acks if r[1] == node and r[3] == "watchdog"]
        assert len(local) >= 2 and all(r[2] == "applied" and r[4] == "failover" for r in local), (node, local)
    incidents = p.client.query(f"SELECT node, kind, state FROM incidents FINAL WHERE node IN {in_nodes}").result_rows
    for node in nodes.values():
        kinds = {r[1] for r in incidents if r[0] == node}
        assert kinds & {"link_down", "link_flap"}, (node, incidents)
        assert any(r[2] == "resolve" for r in incidents if r[0] == node), (node, incidents)


@pytest.fixture
def slow_watchdog_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bed: FailoverBed) -> Iterator[Pipeline]:
    """The pipeline's T_watchdog (2 s) far above the agents' (20 ms): a short down is the agent's alone."""
    yield from _pipeline(tmp_path, monkeypatch, 2000)


def test_a_down_only_the_agents_watchdog_acted_on_is_restored_by_the_pipeline(
        bed: FailoverBed, slow_watchdog_pipeline: Pipeline, tmp_path: Path) -> None:
    """Before: a down shorter than the pipeline's T_watchdog but longer than the agent's was failed over by the
    agent and never restored (the pipeline saw no failover of its own). The agents now report `on_backup`, and
    the pipeline restores such a link after T_stable."""
    p = slow_watchdog_pipeline
    in_nodes = "(" + ",".join(f"'{bed.node(h)}'" for h in HOSTS) + ")"
    with (bed.real_agents(p.settings.bootstrap, tmp_path / "agents", control_public_key_path(p.settings.data_dir),
                          watchdog_ms=20, report_s=0.2) as agents,
          bed.stream() as stream):
        _wait_reported_up(p, in_nodes, "AND on_backup = false")    # with their actuator's view
        stream.wait_bytes(200_000)
        bed.hard_down()
        moved = _wait_route(bed, BACKUP, 5)                 # the agents' watchdogs, 20 ms after the down
        assert moved is not None, [bed.route_to_peer(h) for h in HOSTS]
        time.sleep(0.3)
        _up_then_restored_after_t_stable(bed, stream, agents, "left on the backup")   # down ~0.3 s: below 2 s
    result = stream.result
    assert result is not None and result.ok, (result, "lost/reordered bytes or a socket error")
    cmds = _poll(p, f"SELECT node, action FROM control_commands FINAL WHERE node IN {in_nodes}",
                 lambda rows: len(rows) >= 2, 30)
    assert sorted(cmds) == sorted((bed.node(h), "restore") for h in HOSTS), cmds   # no failover from here
    rows = p.client.query(f"SELECT node, incident_id, kind, state, detail FROM incidents FINAL "
                          f"WHERE node IN {in_nodes} ORDER BY node, state").result_rows
    for host in HOSTS:   # one incident per host: opened saying what the agent did (a flap update may follow), resolved
        mine = [r for r in rows if r[0] == bed.node(host)]
        assert len({r[1] for r in mine}) == 1 and {r[3] for r in mine} >= {"open", "resolve"}, mine
        opened = next(r for r in mine if r[3] == "open")
        assert opened[2] == "link_down" and "the node's watchdog moved pri's traffic to bkp" in opened[4], mine


def test_the_agent_netns_setting_reaches_the_link_source_topology_and_routing(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """CLOCKTOWER_AGENT_NETNS (what the proof above runs the agents with) is passed to all three; a name that
    is not a plain netns name (a path) is refused."""
    from pydantic import ValidationError

    from clocktower import agent_cli
    from clocktower.actuators.settings import ActuatorSettings
    from clocktower.producers.agent import factory
    from clocktower.producers.agent.config import AgentSettings

    monkeypatch.setenv("CLOCKTOWER_AGENT_NETNS", "blue")
    settings = AgentSettings(sources=("links",))
    assert settings.netns == "blue"
    (source,) = factory.build_sources(settings)
    assert source.netns == "blue"
    seen: dict = {}
    monkeypatch.setattr(factory, "discover", lambda *a, **kw: seen.update(kw) or None)
    factory.topology_for(settings)._discover()  # noqa: SLF001 - the call the cache makes
    assert seen.get("netns") == "blue"
    made: dict = {}
    monkeypatch.setattr("clocktower.actuators.route_table.KernelRouting",
                        lambda path, netns=None: made.update(path=path, netns=netns))
    monkeypatch.setattr(agent_cli, "_has_net_admin", lambda: True)
    agent_cli.kernel_routing(ActuatorSettings(state_dir=tmp_path), "blue")
    assert made == {"path": tmp_path / "routes.json", "netns": "blue"}
    for bad in ("../etc", "a/b", ""):
        monkeypatch.setenv("CLOCKTOWER_AGENT_NETNS", bad)
        with pytest.raises(ValidationError):
            AgentSettings()
