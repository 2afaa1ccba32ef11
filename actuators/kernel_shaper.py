"""The kernel backend of TrafficShaper: an HTB qdisc on each shaped link's egress, through pyroute2.

On the first limit on a link it replaces the link's root qdisc with HTB of its own handle (c7:, default class
c7:20) under one class c7:1 at the link's rate, with two children: c7:10, the high class (control/traffic_class.py:
skb->priority 0xc70010), served first (prio 0) with 90 % of the link guaranteed, and c7:20, the low class and the
default, with 10 % guaranteed. Both may borrow up to their ceiling: the link for high, the share held for low (a
pause keeps a trickle of 8 kbit/s: HTB cannot close a class). A link that already has this qdisc and its classes
only has its low class changed, so every limit is idempotent; a qdisc of this handle missing a class (an install
cut short) is installed again, and an install that fails is rolled back. When the last holder's limit is lifted
the qdisc is deleted, and the kernel gives the link back its default root qdisc. The link's rate is configured
(CLOCKTOWER_ACTUATOR_QOS_LINKS), never read from a command.

Installing replaces whatever root qdisc was there, and removing leaves the kernel's default in its place: an
operator's own root qdisc on a shaped link (or a multi-queue NIC's `mq` and its per-queue qdiscs, which the kernel
does make again) is not kept. That is why no link is shaped before the first command for it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from clocktower.actuators.traffic_shaper import Holders, ShapingError, TrafficShaper
from clocktower.control.traffic_class import HANDLE, HIGH_CLASSID, LOW_CLASSID

log = logging.getLogger(__name__)
ROOT = HANDLE << 16          # c7:
PARENT = ROOT | 1            # c7:1
TRICKLE_KBIT = 8
HIGH_GUARANTEE = 0.9
ROOT_PARENT = 0xFFFFFFFF


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
        self._holders = Holders()
        self._lock = threading.Lock()

    def _ipr(self) -> Any:
        from pyroute2 import IPRoute  # only where it is used
        return IPRoute(netns=self.netns, flags=0) if self.netns else IPRoute()

    def limit(self, share: float, holder: str) -> str:
        with self._lock:
            share = self._holders.hold(holder, share)
            return self._each(lambda ipr, index, link, kbit: _shape(ipr, index, link, kbit, share), share)

    def resume(self, holder: str) -> str:
        with self._lock:
            left = self._holders.release(holder)
            if left is not None:
                return self._each(lambda ipr, index, link, kbit: _shape(ipr, index, link, kbit, left), left)
            return self._each(_unshape, 1.0)

    def low_share(self) -> float | None:
        return self._share

    def leftover(self) -> bool:
        """A shaped link whose root qdisc is ours (c7:): a previous actuator's limit, never lifted."""
        with self._lock:
            try:
                with self._ipr() as ipr:
                    for link in self.links:
                        found = ipr.link_lookup(ifname=link)
                        root = _root(ipr, found[0]) if found else None
                        if root is not None and root["handle"] == ROOT:
                            return True
            except Exception as exc:  # noqa: BLE001 - unknown is not leftover; the next limit finds it installed
                log.warning("could not look for shaping left by an earlier actuator: %s", exc)
            return False

    def _each(self, fn: Any, share: float) -> str:
        done = []
        try:
            with self._ipr() as ipr:
                for link, mbit in self.links.items():
                    found = ipr.link_lookup(ifname=link)
                    if not found:
                        raise ShapingError(f"no link {link} on this node")
                    done.append(fn(ipr, found[0], link, mbit * 1000))
        except ShapingError:
            raise
        except Exception as exc:  # noqa: BLE001 - netlink errors become the ack's detail
            raise ShapingError(f"tc failed: {type(exc).__name__}: {exc}") from None
        self._share = share
        return "; ".join(done)


def _root(ipr: Any, index: int) -> Any:
    roots = [q for q in ipr.get_qdiscs(index=index) if q["parent"] == ROOT_PARENT]
    return roots[0] if roots else None


def _ours(ipr: Any, index: int) -> bool:
    root = _root(ipr, index)
    if root is None or root.get_attr("TCA_KIND") != "htb" or root["handle"] != ROOT:
        return False
    classes = {c["handle"] for c in ipr.get_classes(index=index)}
    return {PARENT, HIGH_CLASSID, LOW_CLASSID} <= classes


def _shape(ipr: Any, index: int, link: str, kbit: int, share: float) -> str:
    ceil = max(TRICKLE_KBIT, round(kbit * share))
    rate = min(ceil, max(TRICKLE_KBIT, round(kbit * (1 - HIGH_GUARANTEE))))
    installed = not _ours(ipr, index)
    if installed:
        root = _root(ipr, index)
        if root is not None and root["handle"] != 0:   # a qdisc of its own (a kind cannot be swapped in place); the
            ipr.tc("del", index=index, handle=root["handle"], root=True)   # kernel's default (handle 0) is taken over
        try:
            ipr.tc("add", "htb", index, ROOT, default=LOW_CLASSID & 0xFFFF)
            ipr.tc("add-class", "htb", index, PARENT, parent=ROOT, rate=f"{kbit}kbit", ceil=f"{kbit}kbit")
            ipr.tc("add-class", "htb", index, HIGH_CLASSID, parent=PARENT, rate=f"{round(kbit * HIGH_GUARANTEE)}kbit",
                   ceil=f"{kbit}kbit", prio=0)
            ipr.tc("add-class", "htb", index, LOW_CLASSID, parent=PARENT, rate=f"{rate}kbit", ceil=f"{ceil}kbit",
                   prio=1)
        except Exception:
            _unshape(ipr, index, link, kbit)   # never leave a half-built qdisc
            raise
    else:
        ipr.tc("change-class", "htb", index, LOW_CLASSID, parent=PARENT, rate=f"{rate}kbit", ceil=f"{ceil}kbit",
               prio=1)
    what = "paused (8 kbit/s)" if ceil == TRICKLE_KBIT else f"capped at {share:.0%}"
    return f"{link}: low class {what} of {kbit / 1000:g} Mbit/s" + (" (HTB installed)" if installed else "")


def _unshape(ipr: Any, index: int, link: str, kbit: int) -> str:
    root = _root(ipr, index)
    if root is None or root["handle"] != ROOT:
        return f"{link}: not shaped"
    ipr.tc("del", index=index, handle=ROOT, root=True)
    return f"{link}: shaping removed, the whole link given back"
