/* Per-flow socket bytes, TCP retransmits and TCP state changes, from tracepoints only
 * (no kprobes/fentry needed). Compiled by BCC; see flow_source.py.
 *
 * Counters are kept per time slot: the key holds slot = bpf_ktime_get_ns() / SLOT_NS (CLOCK_MONOTONIC,
 * SLOT_NS a -D flag, 10 ms by default), so the kernel aggregates at the slot's resolution and the drain
 * thread can wake far less often than once per slot (a Python wake-up costs ~150 us of CPU; the data is
 * cheap). Counters are double-buffered: `sel[0]` says which of flows0/flows1 the programs add to. Each
 * drain reads and deletes the map the previous drain flipped away from (a whole period ago, far longer
 * than any program run), then flips, so no byte is lost or counted twice. A slot that straddles a flip
 * has entries in both maps; the drain merges them before emitting the slot (flow_source.py).
 *
 * Compile flags: MAX_FLOWS (entries per map: flows x slots per drain period), SLOT_NS, RINGBUF_PAGES.
 */
#include <uapi/linux/ptrace.h>
#include <net/sock.h>
#include <linux/socket.h>
#include <linux/in.h>

#define DIR_TX 0
#define DIR_RX 1
#define MSG_PEEK_FLAG 2   /* recv with MSG_PEEK consumes nothing */

struct flow_key {
    u8  saddr[16];        /* IPv4 in the first 4 bytes, the rest zero */
    u8  daddr[16];
    u16 sport;            /* host byte order */
    u16 dport;
    u8  family;           /* AF_INET or AF_INET6 */
    u8  proto;            /* IPPROTO_TCP or IPPROTO_UDP */
    u8  dir;              /* DIR_TX or DIR_RX; tx: src = local, rx: src = remote */
    u8  pad;
    u64 slot;             /* bpf_ktime_get_ns() / SLOT_NS when counted */
};

struct flow_val {
    u64 bytes;
    u64 calls;            /* socket calls that moved bytes (not packets) */
    u64 retransmits;
};

struct state_event {
    u64 ts_ns;            /* bpf_ktime_get_ns(), CLOCK_MONOTONIC */
    u8  saddr[16];
    u8  daddr[16];
    u16 sport;
    u16 dport;
    u16 family;
    u16 pad;
    s32 oldstate;
    s32 newstate;
};

BPF_ARRAY(sel, u32, 1);
BPF_HASH(flows0, struct flow_key, struct flow_val, MAX_FLOWS);
BPF_HASH(flows1, struct flow_key, struct flow_val, MAX_FLOWS);
/* dirty[i] = 1 once map i got an entry since its last drain: the drain skips empty maps (walking the
 * buckets of an empty 64k-entry hash map costs ~80 us, most of an idle agent's CPU at 100 drains/s). */
BPF_ARRAY(dirty, u64, 2);
BPF_ARRAY(lost, u64, 2);              /* [0] updates refused (a map full), [1] calls with no 5-tuple */
/* The local port of each TCP socket, from inet_sock_set_state: once a socket reaches CLOSE and its port
 * is released (inet_put_port), skc_num reads 0, yet the application may still read the last bytes. */
BPF_TABLE("lru_hash", u64, u16, lports, MAX_FLOWS);
BPF_RINGBUF_OUTPUT(states, RINGBUF_PAGES);

static __always_inline void add(struct flow_key *k, u64 bytes, u64 calls, u64 retx) {
    int zero = 0;
    u32 *s = sel.lookup(&zero);
    u32 which = s ? *s : 0;
    /* The clock is read after the selector: a count that lands in the map the drain just flipped to
     * has a slot at or after the flip (the drain's rule for which slots are complete relies on it). */
    k->slot = bpf_ktime_get_ns() / SLOT_NS;
    struct flow_val init = {};
    struct flow_val *v;
    if (which == 0)
        v = flows0.lookup_or_try_init(k, &init);
    else
        v = flows1.lookup_or_try_init(k, &init);
    if (!v) {
        u64 *l = lost.lookup(&zero);
        if (l) __sync_fetch_and_add(l, 1);
        return;
    }
    u64 *d = dirty.lookup(&which);
    if (d && !*d) *d = 1;
    if (bytes) __sync_fetch_and_add(&v->bytes, bytes);
    if (calls) __sync_fetch_and_add(&v->calls, calls);
    if (retx) __sync_fetch_and_add(&v->retransmits, retx);
}

/* Fill the key from the socket: local/remote addresses and ports from sk->__sk_common. */
static __always_inline int key_from_sock(struct sock *sk, struct flow_key *k, u8 dir) {
    u16 family = 0, lport = 0, rport = 0;
    bpf_probe_read_kernel(&family, sizeof(family), &sk->__sk_common.skc_family);
    bpf_probe_read_kernel(&lport, sizeof(lport), &sk->__sk_common.skc_num);
    bpf_probe_read_kernel(&rport, sizeof(rport), &sk->__sk_common.skc_dport);
    rport = ntohs(rport);
    if (rport == 0)       /* unconnected (e.g. a UDP socket using sendto): no 5-tuple on the socket */
        return -1;
    if (lport == 0) {     /* port already released: the one seen at the last state change */
        u64 skaddr = (u64)sk;
        u16 *cached = lports.lookup(&skaddr);
        if (!cached) {
            int one = 1;
            u64 *l = lost.lookup(&one);
            if (l) __sync_fetch_and_add(l, 1);
            return -1;
        }
        lport = *cached;
    }
    u8 *src = dir == DIR_TX ? k->saddr : k->daddr;   /* local end */
    u8 *dst = dir == DIR_TX ? k->daddr : k->saddr;   /* remote end */
    if (family == AF_INET) {
        bpf_probe_read_kernel(src, 4, &sk->__sk_common.skc_rcv_saddr);
        bpf_probe_read_kernel(dst, 4, &sk->__sk_common.skc_daddr);
    } else if (family == AF_INET6) {
        bpf_probe_read_kernel(src, 16, &sk->__sk_common.skc_v6_rcv_saddr);
        bpf_probe_read_kernel(dst, 16, &sk->__sk_common.skc_v6_daddr);
    } else {
        return -1;
    }
    k->sport = dir == DIR_TX ? lport : rport;
    k->dport = dir == DIR_TX ? rport : lport;
    k->family = family;
    k->dir = dir;
    return 0;
}

static __always_inline int count_length(void *skp, u16 family, u16 protocol, int ret, int flags, u8 dir) {
    if (ret <= 0)
        return 0;
    if (family != AF_INET && family != AF_INET6)
        return 0;
    if (protocol != IPPROTO_TCP && protocol != IPPROTO_UDP)
        return 0;
    if (dir == DIR_RX && (flags & MSG_PEEK_FLAG))
        return 0;
    struct flow_key k = {};
    if (key_from_sock((struct sock *)skp, &k, dir) < 0)
        return 0;
    k.proto = protocol;
    add(&k, (u64)ret, 1, 0);
    return 0;
}

TRACEPOINT_PROBE(sock, sock_send_length) {
    return count_length(args->sk, args->family, args->protocol, args->ret, args->flags, DIR_TX);
}

TRACEPOINT_PROBE(sock, sock_recv_length) {
    return count_length(args->sk, args->family, args->protocol, args->ret, args->flags, DIR_RX);
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb) {
    struct flow_key k = {};
    if (args->family == AF_INET) {
        __builtin_memcpy(k.saddr, args->saddr, 4);
        __builtin_memcpy(k.daddr, args->daddr, 4);
    } else if (args->family == AF_INET6) {
        __builtin_memcpy(k.saddr, args->saddr_v6, 16);
        __builtin_memcpy(k.daddr, args->daddr_v6, 16);
    } else {
        return 0;
    }
    k.sport = args->sport;    /* the tracepoint gives host byte order */
    k.dport = args->dport;
    k.family = args->family;
    k.proto = IPPROTO_TCP;
    k.dir = DIR_TX;
    add(&k, 0, 0, 1);
    return 0;
}

TRACEPOINT_PROBE(sock, inet_sock_set_state) {
    if (args->protocol != IPPROTO_TCP)
        return 0;
    if (args->sport) {
        u64 skaddr = (u64)args->skaddr;
        u16 sport = args->sport;
        lports.update(&skaddr, &sport);
    }
    struct state_event *e = states.ringbuf_reserve(sizeof(struct state_event));
    if (!e) {
        int zero = 0;
        u64 *l = lost.lookup(&zero);
        if (l) __sync_fetch_and_add(l, 1);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->ts_ns = bpf_ktime_get_ns();
    if (args->family == AF_INET6) {
        __builtin_memcpy(e->saddr, args->saddr_v6, 16);
        __builtin_memcpy(e->daddr, args->daddr_v6, 16);
    } else {
        __builtin_memcpy(e->saddr, args->saddr, 4);
        __builtin_memcpy(e->daddr, args->daddr, 4);
    }
    e->sport = args->sport;
    e->dport = args->dport;
    e->family = args->family;
    e->oldstate = args->oldstate;
    e->newstate = args->newstate;
    states.ringbuf_submit(e, 0);
    return 0;
}
