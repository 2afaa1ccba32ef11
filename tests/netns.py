"""Network namespaces joined by veth pairs, for the tests that need real links and real traffic.

The helpers are context managers that skip the test (saying why) when the machine cannot create them
(not root, no netns support) and always remove what they created: removing a namespace deletes the
veth ends inside it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest


def _need_root() -> None:
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("creating network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) on Linux")


@contextmanager
def joined_namespaces(prefix: str, addresses: tuple[str, str]
                      ) -> Iterator[tuple[tuple[str, str], tuple[str, str]]]:
    """Two namespaces joined by a veth pair, `addresses[i]`/24 on end i, all links up: (names, links)."""
    _need_root()
    from pyroute2 import IPRoute, NetNS, netns

    tag = f"{os.getpid() % 100000}"
    names = (f"{prefix}-a-{tag}", f"{prefix}-b-{tag}")
    links = (f"{prefix[:4]}a{tag}", f"{prefix[:4]}b{tag}")
    created: list[str] = []
    try:
        for name in names:
            netns.create(name)
            created.append(name)
        with IPRoute() as ip:
            ip.link("add", ifname=links[0], kind="veth", peer={"ifname": links[1]})
            for ifname, name in zip(links, names, strict=True):
                ip.link("set", index=ip.link_lookup(ifname=ifname)[0], net_ns_fd=name)
        for name, ifname, address in zip(names, links, addresses, strict=True):
            with NetNS(name) as ns:
                index = ns.link_lookup(ifname=ifname)[0]
                ns.addr("add", index=index, address=address, prefixlen=24)
                ns.link("set", index=index, state="up")
                ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
    except OSError as exc:
        for name in created:
            netns.remove(name)
        pytest.skip(f"cannot create network namespaces and a veth pair here: {exc}")
    try:
        yield names, links
    finally:
        for name in created:
            netns.remove(name)
        assert not set(created) & set(netns.listnetns())


@contextmanager
def new_namespace(ns: str) -> Iterator[str]:
    """An empty namespace `ns`, removed afterwards (the test is skipped, saying why, where none can be made)."""
    _need_root()
    from pyroute2 import netns

    try:
        netns.create(ns)
    except Exception as e:  # noqa: BLE001 - any failure here means: no netns support
        pytest.skip(f"network namespaces unsupported here: {e}")
    try:
        yield ns
    finally:
        netns.remove(ns)


@contextmanager
def namespace_with_veth(ns: str, a: str, b: str) -> Iterator[str]:
    """One namespace `ns` holding both ends `a` and `b` of a veth pair, both set up."""
    from pyroute2 import IPRoute

    with new_namespace(ns):
        with IPRoute(netns=ns, flags=0) as ip:
            ip.link("add", ifname=a, kind="veth", peer=b)
            for name in (b, a):
                ip.link("set", index=ip.link_lookup(ifname=name)[0], state="up")
        yield ns


@contextmanager
def shaped_paths(a: str, b: str, nets: dict[str, str], rate_mbit: int, tag: str) -> Iterator[None]:
    """Namespaces `a` and `b` joined by one veth pair per port of `nets` (port name -> /24 prefix: `a` holds .1,
    `b` .2, both ends named after the port), each path shaped on a's side to `rate_mbit` with a deep queue (tbf).
    The veths are named `tag` + a digit; leftovers of these names (a killed run of this pid) are removed first."""
    _need_root()
    from pyroute2 import IPRoute, netns

    veths = [f"{tag}{i}" for i in range(2 * len(nets))]

    def clear() -> None:
        for ns in (a, b):
            with suppress(OSError, FileNotFoundError):
                netns.remove(ns)
        with IPRoute() as ip:   # an end left in the root namespace if building failed early
            for name in veths:
                for index in ip.link_lookup(ifname=name):
                    ip.link("del", index=index)

    clear()
    try:
        for ns in (a, b):
            netns.create(ns)
        with IPRoute() as ip:
            for x, y in zip(veths[0::2], veths[1::2], strict=True):
                ip.link("add", ifname=x, kind="veth", peer={"ifname": y})
                ip.link("set", index=ip.link_lookup(ifname=x)[0], net_ns_fd=a)
                ip.link("set", index=ip.link_lookup(ifname=y)[0], net_ns_fd=b)
        for ns, host, ends in ((a, 1, veths[0::2]), (b, 2, veths[1::2])):
            with IPRoute(netns=ns, flags=0) as ipr:
                for end, (port, net) in zip(ends, nets.items(), strict=True):
                    index = ipr.link_lookup(ifname=end)[0]
                    ipr.link("set", index=index, ifname=port)
                    ipr.addr("add", index=index, address=f"{net}.{host}", prefixlen=24)
                    ipr.link("set", index=index, state="up")
                    if ns == a:
                        ipr.tc("add", "tbf", index, 0x10000, rate=f"{rate_mbit}mbit", burst=15000, latency="300ms")
                ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
    except OSError as exc:   # root, but no netns, veth or tbf here (a container without the capabilities)
        clear()
        pytest.skip(f"cannot build two network namespaces joined by shaped veth pairs here: {exc}")
    try:
        yield
    finally:
        clear()
