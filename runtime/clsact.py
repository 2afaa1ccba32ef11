"""The tc clsact hook that the agent's flow classifier and the actuator's redirect filter share on a port.

Each attaches its own BPF filter at its own priority, adding the clsact qdisc only where the port has none, and on
detach removes its filter, and the qdisc only where it added it and no filter of anyone (the other's, another
tool's) is left on it. `ipr` is an open pyroute2 IPRoute in the port's namespace.
"""

from __future__ import annotations

import contextlib
from typing import Any

INGRESS = "ffff:fff2"
EGRESS = "ffff:fff3"


def ensure_clsact(ipr: Any, index: int) -> bool:
    """Add a clsact qdisc to the port unless it has one; whether this call added it."""
    if any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index=index)):
        return False
    ipr.tc("add", "clsact", index)
    return True


def remove_filter(ipr: Any, index: int, parent: str, prio: int) -> None:
    """Remove our BPF filter at `prio` from one side of the hook; gone already is fine."""
    from pyroute2.netlink.exceptions import NetlinkError

    with contextlib.suppress(NetlinkError):
        ipr.tc("del-filter", "bpf", index, ":1", parent=parent, prio=prio)


def release_clsact(ipr: Any, index: int, created: bool) -> None:
    """Remove the clsact qdisc if we added it (`created`) and no filter is left on either side."""
    if created and not any(f.get_attr("TCA_KIND") for parent in (INGRESS, EGRESS)
                           for f in ipr.get_filters(index=index, parent=parent)):
        ipr.tc("del", "clsact", index)
