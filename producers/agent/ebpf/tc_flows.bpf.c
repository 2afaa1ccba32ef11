/* tc clsact classifier (ingress and egress): packets and bytes per flow (5-tuple) and skb->priority.
 * Compiled by BCC as SCHED_CLS; see tc_classifier.py. Never drops or redirects: returns TC_ACT_UNSPEC, so the
 * packet goes on to the next filter on the hook (the actuator's flow redirect, actuators/flow_redirect.bpf.c,
 * which reads the skb->priority set here), then to the qdisc.
 *
 * Hook for marking/shaping: `prio` maps a 5-tuple (as seen in the packet) to an skb->priority that
 * is applied before counting (egress priority selects an HTB class through the qdisc's mapping).
 * Counters are per time slot (slot = bpf_ktime_get_ns() / SLOT_NS in the key) and double-buffered, like
 * flows.bpf.c (sel[0] picks counts0 or counts1); tc_classifier.py merges a slot's entries across maps.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/in.h>

#define DIR_TX 0   /* egress */
#define DIR_RX 1   /* ingress */

struct tuple {
    u8  saddr[16];
    u8  daddr[16];
    u16 sport;        /* host byte order */
    u16 dport;
    u8  family;       /* 2 = AF_INET, 10 = AF_INET6 */
    u8  proto;        /* IPPROTO_TCP / IPPROTO_UDP */
    u16 pad;
};

struct tc_key {
    struct tuple t;
    u32 ifindex;
    u32 priority;
    u8  dir;
    u8  pad[7];
    u64 slot;         /* bpf_ktime_get_ns() / SLOT_NS when counted */
};

struct tc_val {
    u64 bytes;        /* skb->len at the hook (L2 frame; a GSO skb counts its headers once) */
    u64 packets;      /* wire packets: gso_segs for a GSO skb, else 1 */
};

BPF_ARRAY(sel, u32, 1);
BPF_HASH(counts0, struct tc_key, struct tc_val, MAX_FLOWS);
BPF_HASH(counts1, struct tc_key, struct tc_val, MAX_FLOWS);
/* dirty[i] = 1 once map i got an entry since its last drain: the drain skips empty maps (walking the
 * buckets of an empty 64k-entry hash map costs ~80 us, most of an idle agent's CPU at 100 drains/s). */
BPF_ARRAY(dirty, u64, 2);
BPF_ARRAY(lost, u64, 1);
BPF_HASH(prio, struct tuple, u32, 4096);

static __always_inline int parse(struct __sk_buff *skb, struct tuple *t) {
    u32 off = ETH_HLEN;
    u8 l4 = 0;
    if (skb->protocol == htons(ETH_P_IP)) {
        struct iphdr ip;
        if (bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)) < 0)
            return -1;
        if (ip.frag_off & htons(0x1fff))          /* non-first fragment: no ports */
            return -1;
        __builtin_memcpy(t->saddr, &ip.saddr, 4);
        __builtin_memcpy(t->daddr, &ip.daddr, 4);
        t->family = 2;
        l4 = ip.protocol;
        off += ip.ihl * 4;
    } else if (skb->protocol == htons(ETH_P_IPV6)) {
        struct ipv6hdr ip6;
        if (bpf_skb_load_bytes(skb, off, &ip6, sizeof(ip6)) < 0)
            return -1;
        __builtin_memcpy(t->saddr, &ip6.saddr, 16);
        __builtin_memcpy(t->daddr, &ip6.daddr, 16);
        t->family = 10;
        l4 = ip6.nexthdr;                          /* extension headers are not followed */
        off += sizeof(ip6);
    } else {
        return -1;
    }
    if (l4 != IPPROTO_TCP && l4 != IPPROTO_UDP)
        return -1;
    u16 ports[2];
    if (bpf_skb_load_bytes(skb, off, ports, sizeof(ports)) < 0)
        return -1;
    t->sport = ntohs(ports[0]);
    t->dport = ntohs(ports[1]);
    t->proto = l4;
    return 0;
}

static __always_inline int classify(struct __sk_buff *skb, u8 dir) {
    struct tc_key k = {};
    if (parse(skb, &k.t) < 0)
        return TC_ACT_UNSPEC;
    u32 *p = prio.lookup(&k.t);
    if (p)
        skb->priority = *p;
    k.ifindex = skb->ifindex;
    k.priority = skb->priority;
    k.dir = dir;
    int zero = 0;
    u32 *s = sel.lookup(&zero);
    u32 which = s ? *s : 0;
    k.slot = bpf_ktime_get_ns() / SLOT_NS;     /* after the selector: see flows.bpf.c */
    struct tc_val init = {};
    struct tc_val *v;
    if (which == 0)
        v = counts0.lookup_or_try_init(&k, &init);
    else
        v = counts1.lookup_or_try_init(&k, &init);
    if (!v) {
        u64 *l = lost.lookup(&zero);
        if (l) __sync_fetch_and_add(l, 1);
        return TC_ACT_UNSPEC;
    }
    u64 *d = dirty.lookup(&which);
    if (d && !*d) *d = 1;
    u32 segs = skb->gso_segs;
    __sync_fetch_and_add(&v->bytes, skb->len);
    __sync_fetch_and_add(&v->packets, segs > 1 ? segs : 1);
    return TC_ACT_UNSPEC;
}

int tc_ingress(struct __sk_buff *skb) { return classify(skb, DIR_RX); }
int tc_egress(struct __sk_buff *skb) { return classify(skb, DIR_TX); }
