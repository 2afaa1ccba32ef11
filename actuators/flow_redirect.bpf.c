/* tc clsact egress filter: the low traffic class toward a redirected destination leaves by another port.
 * Compiled by BCC as SCHED_CLS; see kernel_redirector.py. Attached after the agent's classifier (a higher tc
 * filter priority), so it sees the skb->priority that classifier set. A packet of the low class (the rule of
 * control/traffic_class.py, passed in as HANDLE, HIGH_CLASSID and HIGH_PRIORITY) whose (egress ifindex, destination
 * address) is in `paths` is sent out of the path's port with bpf_redirect_neigh: the kernel fills in its L2
 * header from the neighbour table (of the path's next hop, or of a route lookup through that port). Every other
 * packet goes on untouched (TC_ACT_UNSPEC: to the next filter, if any, then the qdisc).
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <linux/socket.h>

struct dst_key {
    u32 ifindex;      /* the port the route chose */
    u8  family;       /* 2 = AF_INET, 10 = AF_INET6 */
    u8  pad[3];
    u8  addr[16];     /* the destination address (IPv4 in the first 4 bytes) */
};

struct path {
    u32 ifindex;      /* the port to leave by instead */
    u8  nh_family;    /* 0: no next hop given (a route lookup through that port finds it), 2 or 10 */
    u8  pad[3];
    u8  nh[16];
};

/* BCC 0.26's helpers.h declares bpf_redirect_neigh without its `plen` argument; the kernel's helper takes four. */
static long (*redirect_neigh)(u32 ifindex, struct bpf_redir_neigh *params, int plen, u64 flags) =
    (void *)BPF_FUNC_redirect_neigh;

BPF_HASH(paths, struct dst_key, struct path, MAX_PATHS);
BPF_ARRAY(moved, u64, 1);      /* packets handed to the alternate port, for the actuator's status */

int redirect_low(struct __sk_buff *skb) {
    u32 prio = skb->priority;
    int high = (prio >> 16) == HANDLE ? prio == HIGH_CLASSID : prio >= HIGH_PRIORITY;
    if (high)
        return TC_ACT_UNSPEC;
    struct dst_key k = {};
    k.ifindex = skb->ifindex;
    if (skb->protocol == htons(ETH_P_IP)) {
        if (bpf_skb_load_bytes(skb, ETH_HLEN + 16, k.addr, 4) < 0)
            return TC_ACT_UNSPEC;
        k.family = 2;
    } else if (skb->protocol == htons(ETH_P_IPV6)) {
        if (bpf_skb_load_bytes(skb, ETH_HLEN + 24, k.addr, 16) < 0)
            return TC_ACT_UNSPEC;
        k.family = 10;
    } else {
        return TC_ACT_UNSPEC;
    }
    struct path *p = paths.lookup(&k);
    if (!p)
        return TC_ACT_UNSPEC;
    long rc;
    if (!p->nh_family) {
        rc = redirect_neigh(p->ifindex, NULL, 0, 0);
    } else {
        struct bpf_redir_neigh nh = {};
        if (p->nh_family == 2) {
            nh.nh_family = AF_INET;
            __builtin_memcpy(&nh.ipv4_nh, p->nh, 4);
        } else {
            nh.nh_family = AF_INET6;
            __builtin_memcpy(nh.ipv6_nh, p->nh, 16);
        }
        rc = redirect_neigh(p->ifindex, &nh, sizeof(nh), 0);
    }
    if (rc == TC_ACT_REDIRECT) {
        int zero = 0;
        u64 *n = moved.lookup(&zero);
        if (n)
            __sync_fetch_and_add(n, 1);
    }
    return rc;
}
