/* runqueue_latency: wakeup -> on CPU (sched:sched_wakeup / sched_wakeup_new / sched_switch), microseconds.
 * FILTER_PIDS keeps the threads listed in `pids` (chaoskit fills it with the target process's threads). */
#include "hist.h"

BPF_HASH(start, u32, u64, 65536);
BPF_HASH(pids, u32, u8);
BPF_HISTOGRAM(hist, u32, 1024);

static __always_inline int woken(u32 pid) {
    if (pid == 0)
        return 0;
#if FILTER_PIDS
    if (!pids.lookup(&pid))
        return 0;
#endif
    u64 now = bpf_ktime_get_ns();
    start.update(&pid, &now);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup) { return woken(args->pid); }
TRACEPOINT_PROBE(sched, sched_wakeup_new) { return woken(args->pid); }

TRACEPOINT_PROBE(sched, sched_switch) {
    u32 pid = args->next_pid;
    u64 *ts = start.lookup(&pid);
    if (!ts)
        return 0;
    hist.increment(ck_bucket((bpf_ktime_get_ns() - *ts) / 1000));
    start.delete(&pid);
    return 0;
}
