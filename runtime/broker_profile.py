"""What the embedded broker needs that Kafka does not: one switch, CLOCKTOWER_BROKER_PROFILE (`embedded` | `kafka`).

The embedded broker (noida-db) differs from Apache Kafka in ways the components must make up for; with `kafka`, the
default, none of that runs. `clocktower up` and `demo` set `embedded` for the workers of the broker they start (an
external Kafka, CLOCKTOWER_KAFKA_BOOTSTRAP, keeps the default). `WORKAROUNDS` is the one list: the README's table
is checked against it (tests/test_broker_profile.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import AliasChoices, Field

from clocktower.runtime.idle_pacer import IDLE_FETCH_BACKOFF_S

BrokerProfile = Literal["embedded", "kafka"]


@dataclass(frozen=True)
class Workaround:
    name: str
    where: str
    compensates: str          # what the embedded broker does
    kafka_instead: str        # what a Kafka broker does, so the workaround is off


WORKAROUNDS: tuple[Workaround, ...] = (
    Workaround("idle fetch back-off", "streams/engine/idle_fetch.py, runtime/idle_pacer.py (sink, actuators)",
               "answers every fetch at once, ignoring fetch.wait.max.ms: an idle consumer spins",
               "holds an empty fetch up to fetch.wait.max.ms"),
    Workaround("trickle fetch pause", "runtime/idle_pacer.py (the sink)",
               "answers a caught-up consumer's fetch with the few records since the last one, at once: the fetcher "
               "spins while a live stream trickles in",
               "holds a fetch until fetch.min.bytes or fetch.wait.max.ms"),
    Workaround("delete consumed records", "clocktower/log_trim.py (`up`, `demo`)",
               "keeps every record in memory and rewrites all of them to one JSON file every few seconds: its "
               "CPU grows with what it keeps",
               "writes each record once, to a segment file, and deletes by retention"),
    Workaround("rejoin on an empty assignment", "streams/engine/group_join.py",
               "once answered a follower's SyncGroup with an empty assignment (b''), which kills aiokafka's "
               "coordination task",
               "sends every member its encoded assignment"),
    Workaround("hold acknowledged records", "producers/ack_hold.py (the agent's spooling publisher)",
               "acknowledges (acks=all) before it writes: a kill -9 loses the last second or more",
               "acknowledges acks=all once the in-sync replicas have the record"),
    Workaround("accept oversized fetch responses",
               "actuators/command_consumer.py, sinks/clickhouse/kafka_sink.py, streams/app.py (clock broadcast); "
               "always in the agent's spool read-back and `control`'s ack reader (a ceiling only)",
               "ignores fetch.max.bytes: 110 MiB written to one partition came back as one 108-204 MB response, "
               "over librdkafka's 100 MB receive.message.max.bytes, and the consumer never read again",
               "caps a response at the fetch.max.bytes the consumer asks for (librdkafka: 50 MiB)"),
    Workaround("check for reused offsets", "sinks/clickhouse/resume.py, kafka_sink.py",
               "after such a loss, gives the lost offsets to new records",
               "never reuses an offset (with unclean leader election off, its default)"),
)


@dataclass(frozen=True)
class ProfileSettings:
    """The values the workarounds run with under one profile."""

    idle_fetch_backoff_s: float   # aiokafka (streams) and librdkafka (sink) consumers; 0 = none
    actuator_idle_backoff_s: float  # the node actuators' command consumers: a command waits at most this when idle
    rejoin_on_empty_assignment: bool
    ack_hold_s: float
    check_reused_offsets: bool
    fetch_response_max_bytes: int | None = None   # librdkafka's receive.message.max.bytes; None: its default
    sink_trickle_backoff_s: float = 0.0   # the sink, caught up with a live stream, pauses this long between fetches

    def librdkafka_consumer(self) -> dict[str, int]:
        """What a librdkafka consumer adds to its configuration under this profile."""
        limit = self.fetch_response_max_bytes
        return {} if limit is None else {"receive.message.max.bytes": limit}


# librdkafka's own maximum for receive.message.max.bytes: a response up to 2 GiB is read, and the buffer for it is
# allocated only when one that size comes. The broker's memory (it builds the whole response) runs out before that.
LIBRDKAFKA_MAX_RESPONSE_BYTES = 2_147_483_647
# A record reaching a caught-up sink waits at most this more (runtime/idle_pacer.py); the sink batches 1 s anyway.
SINK_TRICKLE_BACKOFF_S = 0.1


PROFILES: dict[str, ProfileSettings] = {
    # IDLE_FETCH_BACKOFF_S (0.25 s) keeps the idle stack under 5 % of a core (benchmarks/idle_cpu.py); 25 ms keeps
    # an actuator's command latency low (one consumer per node)
    "embedded": ProfileSettings(idle_fetch_backoff_s=IDLE_FETCH_BACKOFF_S, actuator_idle_backoff_s=0.025,
                                rejoin_on_empty_assignment=True, ack_hold_s=5.0, check_reused_offsets=True,
                                fetch_response_max_bytes=LIBRDKAFKA_MAX_RESPONSE_BYTES,
                                sink_trickle_backoff_s=SINK_TRICKLE_BACKOFF_S),
    "kafka": ProfileSettings(idle_fetch_backoff_s=0.0, actuator_idle_backoff_s=0.0,
                             rejoin_on_empty_assignment=False, ack_hold_s=0.0, check_reused_offsets=False),
}


def profile_settings(profile: BrokerProfile) -> ProfileSettings:
    return PROFILES[profile]


def profile_field() -> Any:
    """The `broker_profile` field of a settings model, read from CLOCKTOWER_BROKER_PROFILE whatever its prefix."""
    return Field(default="kafka", validation_alias=AliasChoices("CLOCKTOWER_BROKER_PROFILE", "broker_profile"),
                 description="`kafka` (the default) or `embedded`: the embedded broker's workarounds, on or off "
                 "(runtime/broker_profile.py); `clocktower up` and `demo` set `embedded` for the broker they start")
