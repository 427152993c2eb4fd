/* FILTER_NETNS: keep sockets in one network namespace, the one whose inode number (as /run/netns/NAME's, or
 * /proc/PID/ns/net's) chaoskit puts in the one-entry `netns` map and refreshes at each sample. A socket's own
 * namespace, not its addresses: every namespace has 127.0.0.1, and two namespaces can have the same address.
 * SK_NET (sock.__sk_common.skc_net.net), NET_INUM (net.ns.inum): member offsets from the kernel's BTF. */
BPF_ARRAY(netns, u32, 1);

static __always_inline int in_netns(u64 sk) {
    u32 zero = 0;
    u32 *want = netns.lookup(&zero);
    u64 net = 0;
    u32 inum = 0;
    if (!want || bpf_probe_read_kernel(&net, sizeof(net), (void *)(sk + SK_NET)) || !net)
        return 0;
    if (bpf_probe_read_kernel(&inum, sizeof(inum), (void *)(net + NET_INUM)))
        return 0;
    return inum == *want;
}
