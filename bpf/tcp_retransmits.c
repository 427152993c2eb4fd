/* tcp_retransmits: count per destination (tcp:tcp_retransmit_skb). FILTER_NETNS keeps sockets in the target
 * network namespace (netns.h); FILTER_PORT keeps packets with that source or destination port. */
#if FILTER_NETNS
#include "netns.h"
#endif
struct dest_t {
    u32 daddr;
    u16 dport;
    u16 family;
};
BPF_HASH(counts, struct dest_t, u64);

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb) {
    struct dest_t d = {};
#if FILTER_NETNS
    if (!in_netns((u64)args->skaddr))
        return 0;
#endif
#if FILTER_PORT
    if (args->sport != FILTER_PORT && args->dport != FILTER_PORT)
        return 0;
#endif
    __builtin_memcpy(&d.daddr, args->daddr, 4);
    d.dport = args->dport;
    d.family = args->family;
    counts.increment(d);
    return 0;
}
