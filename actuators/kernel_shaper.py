"""The kernel backend of TrafficShaper: an HTB qdisc on each shaped link's egress, through pyroute2.

On its first action on a link it replaces the link's root qdisc with HTB (handle 1:, default class 1:20) under one
class 1:1 at the link's rate, with two children: 1:10, the high class (control/traffic_class.py: skb->priority
0x10010), served first (prio 0) with 90 % of the link guaranteed, and 1:20, the low class and the default, with
10 % guaranteed. Both may borrow up to their ceiling: the link for high, `share` of it for low (a pause keeps a
trickle of 8 kbit/s: HTB cannot close a class). A link that already has this qdisc only has its low class changed,
so every action is idempotent. The link's rate is configured (CLOCKTOWER_ACTUATOR_QOS_LINKS), never read from the
command.

Replacing the root qdisc replaces whatever was there (on a multi-queue NIC its `mq` root and per-queue qdiscs): that
is the cost of shaping in the kernel, and why no link is shaped before the first command for it.
"""

from __future__ import annotations

import threading
from typing import Any

from clocktower.actuators.traffic_shaper import ShapingError, TrafficShaper
from clocktower.control.traffic_class import HIGH_CLASSID, LOW_CLASSID

ROOT = 0x10000        # 1:
PARENT = 0x10001      # 1:1
TRICKLE_KBIT = 8
HIGH_GUARANTEE = 0.9


class KernelShaper(TrafficShaper):
    def __init__(self, links: dict[str, int], netns: str | None = None) -> None:
        """`links`: link name -> its rate in Mbit/s; `netns`: shape the links of that network namespace."""
        if not links:
            raise ValueError("no link to shape: CLOCKTOWER_ACTUATOR_QOS_LINKS names none")
        bad = {k: v for k, v in links.items() if not 0 < v <= 10_000_000}
        if bad:
            raise ValueError(f"link rates must be in (0, 10,000,000] Mbit/s: {bad}")
        self.links = dict(links)
        self.netns = netns
        self._share: float | None = None
        self._lock = threading.Lock()

    def _ipr(self) -> Any:
        from pyroute2 import IPRoute  # only where it is used
        return IPRoute(netns=self.netns, flags=0) if self.netns else IPRoute()

    def limit(self, share: float) -> str:
        return self._apply(share)

    def resume(self) -> str:
        return self._apply(1.0)

    def low_share(self) -> float | None:
        return self._share

    def _apply(self, share: float) -> str:
        with self._lock:
            done = []
            try:
                with self._ipr() as ipr:
                    for link, mbit in self.links.items():
                        found = ipr.link_lookup(ifname=link)
                        if not found:
                            raise ShapingError(f"no link {link} on this node")
                        done.append(self._shape(ipr, found[0], link, mbit * 1000, share))
            except ShapingError:
                raise
            except Exception as exc:  # noqa: BLE001 - netlink errors become the ack's detail
                raise ShapingError(f"tc failed: {type(exc).__name__}: {exc}") from None
            self._share = share
            return "; ".join(done)

    @staticmethod
    def _shape(ipr: Any, index: int, link: str, kbit: int, share: float) -> str:
        ceil = max(TRICKLE_KBIT, round(kbit * share))
        rate = min(ceil, max(TRICKLE_KBIT, round(kbit * (1 - HIGH_GUARANTEE))))
        roots = [q for q in ipr.get_qdiscs(index=index) if q["parent"] == 0xFFFFFFFF]
        ours = bool(roots) and roots[0].get_attr("TCA_KIND") == "htb" and roots[0]["handle"] == ROOT
        if not ours:
            if roots and roots[0].get_attr("TCA_KIND") != "noqueue":   # a kind cannot be swapped in place
                ipr.tc("del", index=index, handle=roots[0]["handle"], root=True)
            ipr.tc("add", "htb", index, ROOT, default=LOW_CLASSID & 0xFFFF)
            ipr.tc("add-class", "htb", index, PARENT, parent=ROOT, rate=f"{kbit}kbit", ceil=f"{kbit}kbit")
            ipr.tc("add-class", "htb", index, HIGH_CLASSID, parent=PARENT, rate=f"{round(kbit * HIGH_GUARANTEE)}kbit",
                   ceil=f"{kbit}kbit", prio=0)
            ipr.tc("add-class", "htb", index, LOW_CLASSID, parent=PARENT, rate=f"{rate}kbit", ceil=f"{ceil}kbit",
                   prio=1)
        else:
            ipr.tc("change-class", "htb", index, LOW_CLASSID, parent=PARENT, rate=f"{rate}kbit", ceil=f"{ceil}kbit",
                   prio=1)
        what = ("given the whole link" if share >= 1 else "paused (8 kbit/s)" if ceil == TRICKLE_KBIT
                else f"capped at {share:.0%}")
        return f"{link}: low class {what} of {kbit / 1000:g} Mbit/s" + ("" if ours else " (HTB installed)")
