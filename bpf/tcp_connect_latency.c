/* tcp_connect_latency: SYN_SENT -> ESTABLISHED per socket (inet_sock_set_state, a BTF raw tracepoint), in us.
 * Filters (set by chaoskit): FILTER_NETNS keeps sockets in the target network namespace (netns.h);
 * FILTER_PIDS keeps connects made by a tgid in `pids`;
 * FILTER_CGROUP keeps connects made from that cgroup v2 id; FILTER_DPORT. The states are arguments, so the
 * transitions that do not involve SYN_SENT (most of them) return before touching the socket or a map.
 * SK_PROTOCOL, SK_DPORT: member offsets from the kernel's BTF. */
#include "hist.h"
#include "tp_btf.h"
#include "pending.h"
#if FILTER_NETNS
#include "netns.h"
#endif

static __always_inline u16 ck_ntohs(u16 v) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return __builtin_bswap16(v);
#else
    return v;
#endif
}

#ifndef TCP_ESTABLISHED
#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#endif
#ifndef IPPROTO_TCP
#define IPPROTO_TCP 6
#endif

BPF_HASH(pids, u32, u8);
BPF_PERCPU_ARRAY(hist, u64, CK_BUCKETS);

TP_BTF(inet_sock_set_state) { /* (sk, oldstate, newstate) */
    int oldstate = (int)ctx[1], newstate = (int)ctx[2];
    u64 sk = ctx[0];
    if (newstate == TCP_SYN_SENT) {
        if (CK_MEMBER(u16, sk, SK_PROTOCOL) != IPPROTO_TCP)
            return 0;
#if FILTER_PIDS
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        if (!pids.lookup(&tgid))
            return 0;
#endif
#if FILTER_CGROUP
        if (bpf_get_current_cgroup_id() != FILTER_CGROUP)
            return 0;
#endif
#if FILTER_NETNS
        if (!in_netns(sk))
            return 0;
#endif
        pending_put(pending_key(sk), bpf_ktime_get_ns());
        return 0;
    }
    if (oldstate != TCP_SYN_SENT)
        return 0;
    u64 ts = pending_take(pending_key(sk)); /* only TCP sockets were put */
    if (!ts)
        return 0;
    u64 delta = (bpf_ktime_get_ns() - ts) / 1000;
    if (newstate != TCP_ESTABLISHED)
        return 0;
#if FILTER_DPORT
    if (ck_ntohs(CK_MEMBER(u16, sk, SK_DPORT)) != FILTER_DPORT)
        return 0;
#endif
    u32 bucket = ck_bucket(delta);
    u64 *n = hist.lookup(&bucket);
    if (n)
        *n += 1;
    return 0;
}
