"""The kernel backend of FlowRedirector: a BPF filter on each redirecting port's egress (flow_redirect.bpf.c).

At start it compiles the program with BCC and attaches it, through pyroute2, as a direct-action filter on the
clsact egress hook of every port that has an alternate (CLOCKTOWER_ACTUATOR_REDIRECT_PATHS: `eth0=eth1`, or
`eth0=eth1@10.2.0.254` with the alternate path's next hop). Its tc filter priority comes after the agent's
classifier's, so it sees the skb->priority that classifier set. A `redirect` asks the kernel which port each
destination is routed through now, and where that port has an alternate that is up, fills the program's map
(port, destination) -> (alternate, next hop): from then on the low class toward it leaves by the alternate, with
its L2 header from the neighbour table (bpf_redirect_neigh). The high class is never touched.

The receiving node sees that traffic arrive on another port than its route back to the sender: strict reverse-path
filtering there (rp_filter=1) drops it, so multi-rail receivers need rp_filter 0 or 2 (loose), as they usually have.

A filter outlives the process that attached it: one left by an actuator that died is replaced, with an empty map,
when the next one starts (its redirects end: failing open, the congestion detector sends them again while the
congestion lasts), and `close()` removes ours.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import logging
import platform
import socket
import threading
from pathlib import Path
from typing import Any

from clocktower.actuators.flow_redirector import FlowRedirector, Held, NoAlternatePath, RedirectError
from clocktower.control.traffic_class import HANDLE, HIGH_CLASSID, HIGH_PRIORITY
from clocktower.runtime.bcc_build import compile_bpf, find_kernel_source
from clocktower.runtime.clsact import EGRESS, ensure_clsact, release_clsact, remove_filter

log = logging.getLogger(__name__)
PROGRAM = Path(__file__).with_name("flow_redirect.bpf.c")
ARPHRD_ETHER = 1
RTN_UNICAST = 1
FILTER_PRIO = 0xC7A2            # after the agent's classifier (0xC7A1): tc runs filters in priority order
MAX_PATHS = 4096                # (port, destination) entries
DOWN = ("DOWN", "LOWERLAYERDOWN", "NOTPRESENT")
IFF_UP = 0x1

Path_ = tuple[str, str | None]  # (alternate port, its next hop or None)


class KernelRedirector(FlowRedirector):
    def __init__(self, paths: dict[str, Path_], netns: str | None = None,
                 kernel_source: str | None = None) -> None:
        """`paths`: port -> (alternate port, next hop or None); `netns`: ports of that network namespace."""
        if not paths:
            raise ValueError("no alternate path: CLOCKTOWER_ACTUATOR_REDIRECT_PATHS names none")
        for port, (alternate, hop) in paths.items():
            if port == alternate:
                raise ValueError(f"redirect_paths: {port} cannot be its own alternate")
            if hop is not None:
                ipaddress.ip_address(hop)   # ValueError names it
        self.paths = dict(paths)
        self.netns = netns
        self.kernel_source = kernel_source
        self.bpf: Any = None
        self._attached: dict[str, tuple[int, bool]] = {}    # port -> (ifindex, whether we added its clsact)
        self._where: dict[str, tuple[Any, str]] = {}        # destination -> (its map key, the port it leaves by)
        self._held = Held()
        self._lock = threading.Lock()

    def _ipr(self) -> Any:
        from pyroute2 import IPRoute  # only where it is used
        return IPRoute(netns=self.netns, flags=0) if self.netns else IPRoute()

    def start(self) -> str:
        """Compile and attach; returns what was found (a leftover filter replaced). RedirectError says why not, and
        a filter left by an actuator that died is removed all the same (its redirects end: failing open)."""
        with self._lock:
            if self.bpf is not None:
                return f"redirect filter on {', '.join(self.paths)}"
            if any(hop is not None for _, hop in self.paths.values()) and _kernel_before(5, 11):
                raise RedirectError(f"a next hop needs Linux 5.11 or later (bpf_redirect_neigh's parameters); this "
                                    f"is {platform.release()}")
            source, why = find_kernel_source(self.kernel_source)
            try:
                if source is None:
                    raise RedirectError(why)
                try:
                    from bcc import BPF

                    self.bpf = compile_bpf(PROGRAM.read_text(), source, [
                        f"-DMAX_PATHS={MAX_PATHS}", f"-DHANDLE={HANDLE:#x}", f"-DHIGH_CLASSID={HIGH_CLASSID:#x}U",
                        f"-DHIGH_PRIORITY={HIGH_PRIORITY}"])
                    fn = self.bpf.load_func(b"redirect_low", BPF.SCHED_CLS)
                except Exception as exc:  # noqa: BLE001 - BCC raises plain Exception (ImportError without BCC)
                    raise RedirectError(f"the redirect program did not load: {type(exc).__name__}: {exc}") from None
                replaced = self._attach(fn)
            except RedirectError:
                self._detach(leftovers=True)
                raise
        if replaced:
            log.warning("redirects left on %s by an actuator that stopped were removed", ", ".join(replaced))
            return f"redirect filter on {', '.join(self.paths)} (replaced one left on {', '.join(replaced)})"
        return f"redirect filter on {', '.join(self.paths)}"

    def _attach(self, fn: Any) -> list[str]:
        replaced = []
        try:
            with self._ipr() as ipr:
                for port in self.paths:
                    found = ipr.link_lookup(ifname=port)
                    if not found:
                        raise RedirectError(f"no port {port} on this node")
                    index = found[0]
                    if ipr.get_links(index)[0]["ifi_type"] != ARPHRD_ETHER:
                        raise RedirectError(f"{port} is not an Ethernet port (the filter reads IP after 14 bytes)")
                    created = ensure_clsact(ipr, index)
                    if not created and _ours(ipr, index):
                        replaced.append(port)
                    self._attached[port] = (index, created)
                    ipr.tc("replace-filter", "bpf", index, ":1", fd=fn.fd, name=fn.name, parent=EGRESS,
                           classid=1, direct_action=True, prio=FILTER_PRIO)
        except RedirectError:
            raise
        except Exception as exc:  # noqa: BLE001 - netlink errors
            raise RedirectError(f"tc failed: {type(exc).__name__}: {exc}") from None
        return replaced

    def redirect(self, destinations: list[str], holder: str, source: str | None = None) -> str:
        with self._lock:
            if self.bpf is None:
                raise RedirectError("the redirect filter is not attached")
            table = self.bpf[b"paths"]
            moved, why_not = [], []
            try:
                with self._ipr() as ipr:
                    for dst in destinations:
                        port, reason = self._routed_port(ipr, dst, source)
                        alternate, hop = self.paths[port] if port is not None else ("", None)
                        alt_index = self._up_index(ipr, alternate) if port is not None else None
                        if port is not None and alt_index is None:
                            reason = f"its alternate {alternate} is down"
                        if alt_index is None:
                            why_not.append(f"{dst}: {reason}")
                            self._forget(table, dst)   # a path gone since: no longer redirected (never blackholed)
                            continue
                        key = _key(table, self._attached[port][0], dst)   # type: ignore[index]
                        old = self._where.get(dst)
                        if old is not None and bytes(old[0]) != bytes(key):   # routed through another port now
                            self._forget(table, dst)
                        table[key] = _leaf(table, alt_index, hop)
                        self._where[dst] = (key, alternate)
                        self._held.hold(holder, {dst})   # at once: a failure on the next one leaves none unheld
                        moved.append(f"{dst} from {port} to {alternate}")
            except RedirectError:
                raise
            except Exception as exc:  # noqa: BLE001 - netlink or map errors become the ack's detail
                raise RedirectError(f"redirect failed: {type(exc).__name__}: {exc}") from None
            if not moved:
                raise NoAlternatePath("no alternate path: " + "; ".join(why_not))
            return "low class toward " + ", ".join(moved) + (f" (not {'; '.join(why_not)})" if why_not else "")

    def _forget(self, table: Any, dst: str) -> None:
        old = self._where.pop(dst, None)
        if old is not None:
            with contextlib.suppress(KeyError):
                del table[old[0]]
        self._held.forget(dst)

    def _routed_port(self, ipr: Any, dst: str, source: str | None) -> tuple[str | None, str]:
        """The configured port `dst` is routed through now (from `source`), or None and why not."""
        family = socket.AF_INET6 if ipaddress.ip_address(dst).version == 6 else socket.AF_INET
        query: dict[str, Any] = {"dst": dst, "family": family}
        if source is not None and ipaddress.ip_address(source).version == ipaddress.ip_address(dst).version:
            query["src"] = source
        try:
            routes = ipr.route("get", **query)
        except Exception as exc:  # noqa: BLE001 - no route (or a source that is not ours): a netlink error
            return None, f"no route ({exc})"
        if not routes or routes[0]["type"] != RTN_UNICAST:
            return None, "not a unicast route"
        oif = routes[0].get_attr("RTA_OIF")
        for port, (index, _) in self._attached.items():
            if index == oif:
                return port, ""
        name = next(iter(ipr.get_links(oif)), None) if oif else None
        label = name.get_attr("IFLA_IFNAME") if name is not None else "no port"
        return None, f"routed through {label}, which has no alternate path configured"

    @staticmethod
    def _up_index(ipr: Any, port: str) -> int | None:
        found = ipr.link_lookup(ifname=port)
        if not found:
            return None
        link = ipr.get_links(found[0])[0]
        if not link["flags"] & IFF_UP or link.get_attr("IFLA_OPERSTATE") in DOWN:
            return None
        return found[0]

    def release(self, holder: str) -> str:
        with self._lock:
            back = sorted(self._held.release(holder))
            if self.bpf is not None:
                table = self.bpf[b"paths"]
                for dst in back:
                    self._forget(table, dst)
            return f"low class toward {', '.join(back)} back on its routed port" if back else "nothing redirected"

    def redirected(self) -> dict[str, str]:
        with self._lock:
            return {dst: port for dst, (_, port) in self._where.items()}

    def moved_packets(self) -> int:
        """Packets the filter has handed to an alternate port since it started."""
        with self._lock:
            return int(self.bpf[b"moved"][ctypes.c_int(0)].value) if self.bpf is not None else 0

    def close(self) -> None:
        with self._lock:
            self._detach(leftovers=False)
            self._where.clear()
            self._held = Held()
            if self.bpf is not None:
                self.bpf.cleanup()
                self.bpf = None

    def _detach(self, leftovers: bool) -> None:
        """Remove our filter from every port we attached to (`leftovers`: from every configured port, whoever
        attached it), and a clsact we added once no filter is left on it. One port failing does not stop the rest."""
        from pyroute2.netlink.exceptions import NetlinkError

        ports = {p: self._attached.get(p, (None, False)) for p in self.paths} if leftovers else dict(self._attached)
        try:
            ipr_ctx = self._ipr()
        except Exception as exc:  # noqa: BLE001 - a namespace gone: nothing of ours is left there
            log.warning("could not remove the redirect filter: %s", exc)
            return
        with ipr_ctx as ipr:
            for port, (index, created) in ports.items():
                try:
                    if index is None:
                        found = ipr.link_lookup(ifname=port)
                        if not found:
                            continue
                        index = found[0]
                    remove_filter(ipr, index, EGRESS, FILTER_PRIO)
                    release_clsact(ipr, index, created)
                except (NetlinkError, OSError) as exc:
                    log.warning("could not remove the redirect filter from %s: %s", port, exc)
        self._attached.clear()


def _ours(ipr: Any, index: int) -> bool:
    """Whether a filter at our priority is on this port's egress (one left by an actuator that died)."""
    return any(f.get_attr("TCA_KIND") == "bpf" and f["info"] >> 16 == FILTER_PRIO
               for f in ipr.get_filters(index=index, parent=EGRESS))


def _kernel_before(major: int, minor: int) -> bool:
    try:
        found = [int(x) for x in platform.release().split("-")[0].split(".")[:2]]
    except ValueError:
        return False
    return tuple(found) < (major, minor)


def _key(table: Any, ifindex: int, dst: str) -> Any:
    address = ipaddress.ip_address(dst)
    key = table.Key()
    key.ifindex = ifindex
    key.family = 2 if address.version == 4 else 10
    ctypes.memmove(key.addr, address.packed, len(address.packed))
    return key


def _leaf(table: Any, ifindex: int, hop: str | None) -> Any:
    leaf = table.Leaf()
    leaf.ifindex = ifindex
    if hop is not None:
        address = ipaddress.ip_address(hop)
        leaf.nh_family = 2 if address.version == 4 else 10
        ctypes.memmove(leaf.nh, address.packed, len(address.packed))
    return leaf
