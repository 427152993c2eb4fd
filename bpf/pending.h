/* Start times keyed by a kernel address (a task, a request, a socket), for the programs that time the interval
 * between two events on it. A hash-map insert and delete cost more than all the rest of such a program here, and
 * few keys are pending at a time, so they live in a direct-mapped array: slot = a hash of the key, claimed by
 * the first event and released by the second. A key whose slot is held by another key (a collision, or a key
 * whose second event was never seen) goes to the `pending_more` hash instead, so none is lost;
 * `pending_more_size` counts its entries, so that taking a key that was never put (a context switch to a task
 * that was not woken) skips the hash.
 * The claim is a try-lock that needs only the atomic add of BPF's v1 instruction set (bcc compiles for it):
 * add 1 to `claims`; whoever then reads 1 holds the slot; anyone else takes the 1 back.
 * Keys are addresses the kernel passed (BTF pointers), which the verifier will not hash: pending_key() turns
 * one into a plain number by a trip through a per-CPU scratch slot (a store root may make). */
#ifndef PENDING_BITS
#define PENDING_BITS 12
#endif

struct pending_t {
    u64 key;
    u64 ts;
    u64 claims;
};
BPF_ARRAY(pending, struct pending_t, 1 << PENDING_BITS);
BPF_HASH(pending_more, u64, u64, 65536);
BPF_ARRAY(pending_more_size, u64, 1);
BPF_PERCPU_ARRAY(pending_scratch, u64, 1);

static __always_inline u64 pending_key(u64 pointer) {
    u32 zero = 0;
    volatile u64 *scratch = pending_scratch.lookup(&zero);
    if (!scratch)
        return 0;
    *scratch = pointer;
    return *scratch;
}

static __always_inline u32 pending_slot(u64 key) {
    return (u32)((key * 0x9E3779B97F4A7C15ULL) >> (64 - PENDING_BITS));
}

static __always_inline void pending_put(u64 key, u64 ts) {
    if (!key)
        return;
    u32 i = pending_slot(key);
    struct pending_t *p = pending.lookup(&i);
    if (!p)
        return;
    if (p->key == key) { /* already holds the slot: put again before it was taken */
        p->ts = ts;
        return;
    }
    lock_xadd(&p->claims, 1);
    if (*(volatile u64 *)&p->claims == 1) {
        p->ts = ts;
        p->key = key;
        return;
    }
    lock_xadd(&p->claims, -1);
    u32 zero = 0;
    u64 *size = pending_more_size.lookup(&zero);
    if (size && !pending_more.lookup(&key))
        lock_xadd(size, 1);
    pending_more.update(&key, &ts);
}

/* The start time put for key (0: none), taken out. */
static __always_inline u64 pending_take(u64 key) {
    u32 i = pending_slot(key);
    struct pending_t *p = pending.lookup(&i);
    if (p && p->key == key) {
        u64 ts = p->ts;
        p->key = 0;
        lock_xadd(&p->claims, -1);
        return ts;
    }
    u32 zero = 0;
    u64 *size = pending_more_size.lookup(&zero);
    if (!size || !*size)
        return 0;
    u64 *more = pending_more.lookup(&key);
    if (!more)
        return 0;
    u64 ts = *more;
    if (pending_more.delete(&key) == 0)
        lock_xadd(size, -1);
    return ts;
}
