"""The stream worker: `build_app(settings)` wires keys, processors and the Faust engine into one app.

Run it with `python -m clocktower.streams` (clocktower starts it for you); run more with distinct
CLOCKTOWER_STREAMS_INSTANCE_ID values to spread the partitions. Which processor runs where is decided in
streams/topology.py from the registry (streams/registry.py); what happens to each record, bad ones
included, in streams/record_handler.py; what speaks to Faust and aiokafka, under streams/engine/. State is in
Faust tables on the rocksdict store, each with a changelog topic, so a worker that restarts or takes over
partitions recovers it. Importing this module does nothing: `build_app` loads the keys, reads the broker and
installs the engine's fixes.
"""

from __future__ import annotations

import socket

import faust

from clocktower.control.issuer import CommandIssuer
from clocktower.control.key_files import signer_from
from clocktower.schemas.kafka_security import KafkaSecurity
from clocktower.schemas.record_mac import NodeSigning
from clocktower.streams.clock_broadcast import ClockBroadcast
from clocktower.streams.command_topic import command_partitions
from clocktower.streams.emit import use_command_partitions
from clocktower.streams.engine.faust_app import faust_app
from clocktower.streams.engine.faust_fixes import install as install_faust_fixes
from clocktower.streams.engine.faust_worker import FaustWorker
from clocktower.streams.engine.group_join import install as install_group_join_guard
from clocktower.streams.engine.idle_fetch import install as install_idle_fetch_backoff
from clocktower.streams.node_signed_outputs import output_signer
from clocktower.streams.processor_context import context_from_settings
from clocktower.streams.record_handler import identity_check
from clocktower.streams.registry import APP_ID, build
from clocktower.streams.remediation_budget import RemediationBudget
from clocktower.streams.settings import StreamsSettings


def build_app(settings: StreamsSettings) -> faust.App:
    """The Faust app of one stream worker. Raises UserError (no control key, bad key file) before it touches the
    network; patches aiokafka and Faust (streams/engine/) for the whole process, so call it once."""
    signer = signer_from(settings)   # first: without a key the worker stops here, before touching the network
    install_idle_fetch_backoff(settings.idle_fetch_backoff_s)   # 0 but with CLOCKTOWER_BROKER_PROFILE=embedded
    # a dead group coordinator ends the worker for a restart; with the embedded broker an empty assignment rejoins
    install_group_join_guard(rejoin_on_empty=settings.workarounds.rejoin_on_empty_assignment)
    install_faust_fixes()        # records Faust discards in a rebalance are read again (streams/engine/faust_fixes.py)
    instance_id = settings.streams_instance_id or f"{APP_ID}-{socket.gethostname()}"
    security = KafkaSecurity()
    app = faust_app(settings, instance_id, security)
    clocks = ClockBroadcast(settings.bootstrap,
                            {**security.librdkafka(), **settings.workarounds.librdkafka_consumer()})
    use_command_partitions(command_partitions(settings.bootstrap, security.librdkafka()))
    budget = RemediationBudget(settings.remediation_max_per_hour)
    processors = build(context_from_settings(settings, clocks=clocks, remediation_budget=budget,
                                             approval_verifier=signer.verifier()))
    node_signing = NodeSigning()   # CLOCKTOWER_PRODUCER_KEY: check what nodes sign, sign what goes out in their name
    FaustWorker(app, settings, instance_id, processors, CommandIssuer(signer), budget, identity_check(node_signing),
                output_signer(node_signing), clocks)
    return app
