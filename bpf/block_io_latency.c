/* block_io_latency: per request, from when the block layer took it (request.start_time_ns, stamped at allocation
 * wherever the device keeps I/O statistics, `queue/iostats`) to its completion (block_rq_complete, a BTF raw
 * tracepoint), in microseconds, queueing in the I/O scheduler included: one wait per I/O /proc/diskstats counts,
 * each a few microseconds under the time it adds (iostat's await), which also counts the completion's own work.
 * One program run per request, on the completion; a request without the stamp (a device with iostats off and no
 * I/O scheduler) is not timed. FILTER_DEV keeps one device (the kernel's dev_t: major << 20 | minor, from
 * rq->q->disk as the block tracepoints compute it). FILTER_CGROUP keeps requests issued from that cgroup v2 id
 * (direct and synchronous I/O are issued by the process itself): only then does block_rq_issue run too, to mark
 * the requests issued from it. RQ_Q, Q_DISK, DISK_MAJOR, DISK_FIRST_MINOR, RQ_START_TIME_NS: member offsets
 * from the kernel's BTF. */
#include "hist.h"
#include "tp_btf.h"
#if FILTER_CGROUP
#include "pending.h"
#endif

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

#if FILTER_CGROUP
TP_BTF(block_rq_issue) { /* (rq) */
    u64 rq = ctx[0];
#if FILTER_DEV
    if (rq_dev(rq) != FILTER_DEV)
        return 0;
#endif
    if (bpf_get_current_cgroup_id() == FILTER_CGROUP)
        pending_put(pending_key(rq), 1);
    return 0;
}
#endif

TP_BTF(block_rq_complete) { /* (rq, error, nr_bytes) */
    u64 rq = ctx[0];
#if FILTER_CGROUP
    if (!pending_take(pending_key(rq)))
        return 0;
#elif FILTER_DEV
    if (rq_dev(rq) != FILTER_DEV)
        return 0;
#endif
    u64 start = CK_MEMBER(u64, rq, RQ_START_TIME_NS);
    u64 now = bpf_ktime_get_ns();
    if (!start || now < start)
        return 0;
    u32 bucket = ck_bucket((now - start) / 1000);
    u64 *n = hist.lookup(&bucket);
    if (n)
        *n += 1;
    return 0;
}
