/* tcp_retransmits: count per destination (tcp:tcp_retransmit_skb). FILTER_ADDRS keeps packets whose IPv4
 * source is one of the target namespace's addresses; FILTER_PORT keeps packets with that source or
 * destination port. */
struct dest_t {
    u32 daddr;
    u16 dport;
    u16 family;
};
BPF_HASH(addrs, u32, u8);
BPF_HASH(counts, struct dest_t, u64);

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb) {
    struct dest_t d = {};
    u32 saddr = 0;
    __builtin_memcpy(&saddr, args->saddr, 4);
#if FILTER_ADDRS
    if (!addrs.lookup(&saddr))
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
