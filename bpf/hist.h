/* Shared by the histogram programs: log-linear buckets (8 per power of two, exact below 8), in the unit
 * the program records (microseconds), counted in a per-CPU array `hist` that is never cleared (chaoskit
 * reads the running totals and reports the difference). Decoded in chaoskit/probes/ebpf.py. */
#define CK_BUCKETS 512 /* ck_bucket(~0ULL) = 63 * 8 + 7 */

static __always_inline u32 ck_log2(u64 v) {
    u32 r = 0;
    if (v >> 32) { v >>= 32; r += 32; }
    if (v >> 16) { v >>= 16; r += 16; }
    if (v >> 8) { v >>= 8; r += 8; }
    if (v >> 4) { v >>= 4; r += 4; }
    if (v >> 2) { v >>= 2; r += 2; }
    if (v >> 1) { r += 1; }
    return r;
}

static __always_inline u32 ck_bucket(u64 v) {
    if (v < 8)
        return (u32)v;
    u32 lg = ck_log2(v);
    return lg * 8 + (u32)((v >> (lg - 3)) & 7);
}

