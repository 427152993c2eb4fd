/* oom_kills: one event per OOM victim (oom:mark_victim) through a perf buffer: these are rare. cgroup_id is the
 * cgroup v2 id of the task that ran into the OOM (for a memory-cgroup OOM, usually the victim itself). */
struct victim_t {
    u32 pid;
    u32 uid;
    u64 anon_rss_pages;
    u64 total_vm_pages;
    u64 cgroup_id;
    char comm[16];
};
BPF_PERF_OUTPUT(victims);

TRACEPOINT_PROBE(oom, mark_victim) {
    struct victim_t v = {};
    v.pid = args->pid;
    v.uid = args->uid;
    v.anon_rss_pages = args->anon_rss;
    v.total_vm_pages = args->total_vm;
    v.cgroup_id = bpf_get_current_cgroup_id();
    TP_DATA_LOC_READ_STR(&v.comm, comm, sizeof(v.comm));
    victims.perf_submit(args, &v, sizeof(v));
    return 0;
}
