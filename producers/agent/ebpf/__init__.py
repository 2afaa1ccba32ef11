"""eBPF sources of the node agent (BCC): per-flow socket bytes, retransmits, TCP lifecycle, tc counters."""

from clocktower.producers.agent.ebpf.flow_source import FlowSource
from clocktower.producers.agent.ebpf.tc_classifier import TcClassifier

__all__ = ["FlowSource", "TcClassifier"]
