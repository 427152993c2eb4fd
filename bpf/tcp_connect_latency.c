/* tcp_connect_latency: SYN_SENT -> ESTABLISHED per socket (sock:inet_sock_set_state), microseconds.
 * Filters (set by chaoskit): FILTER_ADDRS keeps sockets whose IPv4 source address is in `addrs` (the target
 * namespace's own addresses); FILTER_PIDS keeps connects made by a tgid in `pids`; FILTER_CGROUP keeps connects
 * made from that cgroup v2 id; FILTER_DPORT. */
#include "hist.h"

#ifndef TCP_ESTABLISHED
#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#endif
#ifndef IPPROTO_TCP
#define IPPROTO_TCP 6
#endif

BPF_HASH(start, u64, u64);
BPF_HASH(addrs, u32, u8);
BPF_HASH(pids, u32, u8);
BPF_HISTOGRAM(hist, u32, 1024);

TRACEPOINT_PROBE(sock, inet_sock_set_state) {
    if (args->protocol != IPPROTO_TCP)
        return 0;
    u64 sk = (u64)args->skaddr;
    if (args->newstate == TCP_SYN_SENT) {
#if FILTER_PIDS
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        if (!pids.lookup(&tgid))
            return 0;
#endif
#if FILTER_CGROUP
        if (bpf_get_current_cgroup_id() != FILTER_CGROUP)
            return 0;
#endif
        u64 now = bpf_ktime_get_ns();
        start.update(&sk, &now);
        return 0;
    }
    if (args->oldstate != TCP_SYN_SENT)
        return 0;
    u64 *ts = start.lookup(&sk);
    if (!ts)
        return 0;
    u64 delta = (bpf_ktime_get_ns() - *ts) / 1000;
    start.delete(&sk);
    if (args->newstate != TCP_ESTABLISHED)
        return 0;
#if FILTER_ADDRS
    u32 saddr = 0;
    __builtin_memcpy(&saddr, args->saddr, 4);
    if (!addrs.lookup(&saddr))
        return 0;
#endif
#if FILTER_DPORT
    if (args->dport != FILTER_DPORT)
        return 0;
#endif
    hist.increment(ck_bucket(delta));
    return 0;
}
