/* runqueue_latency: how long each task waited on a run queue before it ran (sched_switch, a BTF raw tracepoint),
 * in microseconds: the waits the kernel itself adds up in /proc/PID/schedstat (run_delay), one per switch-in,
 * whether the task was woken or preempted. The scheduler stamps a task when it queues it
 * (task_struct.sched_info.last_queued, rq_clock) and clears the stamp once the switch is done, so this one
 * program reads the stamp of the task switched in against the clock of its run queue (task -> se.cfs_rq -> rq
 * -> clock, updated by this very schedule): no wakeup program, no table of start times, no clock read.
 * FILTER_PIDS keeps the threads listed in `pids` (chaoskit fills it with the target process's threads).
 * Offsets (TASK_LAST_QUEUED, TASK_CFS_RQ, CFS_RQ_RQ, RQ_CLOCK, TASK_PID) come from the kernel's BTF. */
#include "hist.h"
#include "tp_btf.h"

BPF_HASH(pids, u32, u8);
BPF_PERCPU_ARRAY(hist, u64, CK_BUCKETS);

TP_BTF(sched_switch) { /* (preempt, prev, next, prev_state) */
    u64 next = ctx[2];
    u64 queued = CK_MEMBER(u64, next, TASK_LAST_QUEUED);
    if (!queued)
        return 0;
#if FILTER_PIDS
    u32 pid = CK_MEMBER(u32, next, TASK_PID);
    if (!pids.lookup(&pid))
        return 0;
#endif
    u64 cfs_rq = CK_MEMBER(u64, next, TASK_CFS_RQ);
    if (!cfs_rq)
        return 0;
    u64 rq = CK_MEMBER(u64, cfs_rq, CFS_RQ_RQ);
    if (!rq)
        return 0;
    u64 now = CK_MEMBER(u64, rq, RQ_CLOCK);
    if (now < queued)
        return 0;
    u32 bucket = ck_bucket((now - queued) / 1000);
    u64 *n = hist.lookup(&bucket);
    if (n)
        *n += 1; /* per-CPU, and this runs with interrupts off: no atomic needed */
    return 0;
}
