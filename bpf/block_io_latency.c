/* block_io_latency: issue -> complete per request (block:block_rq_issue / block_rq_complete), microseconds,
 * one histogram per device. FILTER_DEV keeps one device (the kernel's dev_t: major << 20 | minor); FILTER_CGROUP
 * keeps requests issued from that cgroup v2 id (direct and synchronous I/O are issued by the process itself). */
#include "hist.h"

struct req_t {
    u32 dev;
    u32 pad;
    u64 sector;
};
struct key_t {
    u32 dev;
    u32 bucket;
};
BPF_HASH(start, struct req_t, u64, 65536);
BPF_HASH(hist, struct key_t, u64, 16384);

TRACEPOINT_PROBE(block, block_rq_issue) {
#if FILTER_DEV
    if (args->dev != FILTER_DEV)
        return 0;
#endif
#if FILTER_CGROUP
    if (bpf_get_current_cgroup_id() != FILTER_CGROUP)
        return 0;
#endif
    struct req_t r = {.dev = args->dev, .sector = args->sector};
    u64 now = bpf_ktime_get_ns();
    start.update(&r, &now);
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_complete) {
    struct req_t r = {.dev = args->dev, .sector = args->sector};
    u64 *ts = start.lookup(&r);
    if (!ts)
        return 0;
    struct key_t k = {.dev = args->dev, .bucket = ck_bucket((bpf_ktime_get_ns() - *ts) / 1000)};
    start.delete(&r);
    hist.increment(k);
    return 0;
}
