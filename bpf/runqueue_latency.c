/* runqueue_latency: wakeup -> on CPU (sched_wakeup / sched_wakeup_new / sched_switch, as BTF raw tracepoints),
 * microseconds. FILTER_PIDS keeps the threads listed in `pids` (chaoskit fills it with the target process's
 * threads; TASK_PID: offset of task_struct.pid, from the kernel's BTF). These fire on every wakeup and context
 * switch, so the wakeup time is keyed by the task's address (pending.h: no hash-map update, and no read of a
 * task_struct line the scheduler has not just touched). */
#include "hist.h"
#include "tp_btf.h"
#include "pending.h"

BPF_HASH(pids, u32, u8);
BPF_PERCPU_ARRAY(hist, u64, CK_BUCKETS);

static __always_inline int woken(u64 task) {
#if FILTER_PIDS
    u32 pid = CK_MEMBER(u32, task, TASK_PID);
    if (!pids.lookup(&pid))
        return 0;
#endif
    pending_put(pending_key(task), bpf_ktime_get_ns());
    return 0;
}

TP_BTF(sched_wakeup) { return woken(ctx[0]); }     /* (p) */
TP_BTF(sched_wakeup_new) { return woken(ctx[0]); } /* (p) */

TP_BTF(sched_switch) { /* (preempt, prev, next, prev_state) */
    u64 when = pending_take(pending_key(ctx[2]));
    if (!when)
        return 0;
    u32 bucket = ck_bucket((bpf_ktime_get_ns() - when) / 1000);
    u64 *n = hist.lookup(&bucket);
    if (n)
        *n += 1; /* per-CPU, and this runs with interrupts off: no atomic needed */
    return 0;
}
