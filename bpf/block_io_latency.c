/* block_io_latency: issue -> complete per request (block_rq_issue / block_rq_complete, as BTF raw
 * tracepoints), microseconds, matched by the request's address. FILTER_DEV keeps one device (the kernel's dev_t:
 * major << 20 | minor, from rq->q->disk as the block tracepoints compute it); FILTER_CGROUP keeps requests
 * issued from that cgroup v2 id (direct and synchronous I/O are issued by the process itself). RQ_Q, Q_DISK,
 * DISK_MAJOR, DISK_FIRST_MINOR: member offsets from the kernel's BTF. */
#include "hist.h"
#include "tp_btf.h"
#include "pending.h"

BPF_PERCPU_ARRAY(hist, u64, CK_BUCKETS);

#if FILTER_DEV
static __always_inline u32 rq_dev(u64 rq) {
    u64 q = CK_MEMBER(u64, rq, RQ_Q);
    u64 disk = q ? CK_MEMBER(u64, q, Q_DISK) : 0;
    if (!disk)
        return 0;
    return ((u32)CK_MEMBER(int, disk, DISK_MAJOR) << 20) | (u32)CK_MEMBER(int, disk, DISK_FIRST_MINOR);
}
#endif

TP_BTF(block_rq_issue) { /* (rq) */
    u64 rq = ctx[0];
#if FILTER_DEV
    if (rq_dev(rq) != FILTER_DEV)
        return 0;
#endif
#if FILTER_CGROUP
    if (bpf_get_current_cgroup_id() != FILTER_CGROUP)
        return 0;
#endif
    pending_put(pending_key(rq), bpf_ktime_get_ns());
    return 0;
}

TP_BTF(block_rq_complete) { /* (rq, error, nr_bytes) */
    u64 ts = pending_take(pending_key(ctx[0]));
    if (!ts)
        return 0;
    u32 bucket = ck_bucket((bpf_ktime_get_ns() - ts) / 1000);
    u64 *n = hist.lookup(&bucket);
    if (n)
        *n += 1;
    return 0;
}
