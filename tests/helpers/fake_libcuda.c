/* TEST DOUBLE: a simulated CUDA driver (libcuda.so.1 stand-in) for machines without a GPU.
 *
 * It exports the driver calls chaoskit's gpu/cuda.py uses, with the real signatures, so the ctypes binding,
 * the holder process and the engine path are exercised for real. It owns no device memory: one device of
 * $CHAOSKIT_FAKE_CUDA_TOTAL bytes (default 8 GiB) whose "used" bytes are shared by every process through the
 * state file $CHAOSKIT_FAKE_CUDA_STATE, one slot per PID, so another process's allocations show in
 * cuMemGetInfo as on a real GPU, and a dead process's memory is released as the real driver does.
 * Build: cc -shared -fPIC -o libcuda.so.1 fake_libcuda.c
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
#define OK 0
#define ERR_INVALID_VALUE 1
#define ERR_OUT_OF_MEMORY 2
#define ERR_NOT_INITIALIZED 3
#define ERR_INVALID_DEVICE 101
#define SLOTS 256
#define PTRS 65536

struct slot { int32_t pid; uint64_t bytes; };
struct state { struct slot slots[SLOTS]; };

static int g_fd = -1;
static struct state *g_st;
static int g_init;
static uint64_t g_next = 1;
static struct { CUdeviceptr ptr; uint64_t size; } g_ptrs[PTRS];

static uint64_t total_bytes(void) {
    const char *t = getenv("CHAOSKIT_FAKE_CUDA_TOTAL");
    return t ? strtoull(t, NULL, 10) : (8ULL << 30);
}

static int visible(void) { /* CUDA_VISIBLE_DEVICES naming another device than 0 or our UUID: none visible */
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    return !v || !*v || !strcmp(v, "0") || !strncmp(v, "GPU-00000000-0000-0000-0000-00000000c0de", 40);
}

static void lock(void) { flock(g_fd, LOCK_EX); }
static void unlock(void) { flock(g_fd, LOCK_UN); }

static uint64_t used_locked(void) {
    uint64_t used = 0;
    for (int i = 0; i < SLOTS; i++) {
        struct slot *s = &g_st->slots[i];
        if (s->pid && kill(s->pid, 0) != 0 && errno == ESRCH) { s->pid = 0; s->bytes = 0; }
        used += s->bytes;
    }
    return used;
}

static struct slot *my_slot_locked(void) {
    int32_t me = getpid();
    for (int i = 0; i < SLOTS; i++) if (g_st->slots[i].pid == me) return &g_st->slots[i];
    for (int i = 0; i < SLOTS; i++) if (!g_st->slots[i].pid) { g_st->slots[i].pid = me; g_st->slots[i].bytes = 0; return &g_st->slots[i]; }
    return NULL;
}

CUresult cuInit(unsigned int flags) {
    const char *path = getenv("CHAOSKIT_FAKE_CUDA_STATE");
    if (flags != 0) return ERR_INVALID_VALUE;
    if (!path) return 100; /* CUDA_ERROR_NO_DEVICE */
    if (g_init) return OK;
    g_fd = open(path, O_RDWR | O_CREAT, 0600);
    if (g_fd < 0 || ftruncate(g_fd, sizeof(struct state)) != 0) return 999;
    g_st = mmap(NULL, sizeof(struct state), PROT_READ | PROT_WRITE, MAP_SHARED, g_fd, 0);
    if (g_st == MAP_FAILED) return 999;
    g_init = 1;
    return OK;
}

CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuDeviceGetCount(int *n) { if (!g_init) return ERR_NOT_INITIALIZED; *n = visible() ? 1 : 0; return OK; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (!g_init) return ERR_NOT_INITIALIZED;
    if (ordinal != 0 || !visible()) return ERR_INVALID_DEVICE;
    *d = 0; return OK;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    if (d != 0) return ERR_INVALID_DEVICE;
    strncpy(name, "Simulated GPU (chaoskit test double)", len - 1); name[len - 1] = 0; return OK;
}
CUresult cuDeviceGetUuid_v2(unsigned char uuid[16], CUdevice d) {
    static const unsigned char u[16] = {0,0,0,0, 0,0, 0,0, 0,0, 0,0,0,0,0xc0,0xde};
    if (d != 0) return ERR_INVALID_DEVICE;
    memcpy(uuid, u, 16); return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) { if (d != 0) return ERR_INVALID_DEVICE; *bytes = total_bytes(); return OK; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) { if (d != 0) return ERR_INVALID_DEVICE; *ctx = (void *)0x1; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return d == 0 ? OK : ERR_INVALID_DEVICE; }
CUresult cuCtxSetCurrent(CUcontext ctx) { return ctx ? OK : ERR_INVALID_VALUE; }

CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    if (!g_init) return ERR_NOT_INITIALIZED;
    lock();
    uint64_t used = used_locked(), t = total_bytes();
    unlock();
    *total = t; *free = used >= t ? 0 : t - used;
    return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    if (!g_init) return ERR_NOT_INITIALIZED;
    if (size == 0) return ERR_INVALID_VALUE;
    uint64_t rounded = (size + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    int idx = -1;
    for (int i = 0; i < PTRS; i++) if (!g_ptrs[i].ptr) { idx = i; break; }
    if (idx < 0) return ERR_OUT_OF_MEMORY;
    lock();
    struct slot *s = my_slot_locked();
    if (!s || used_locked() + rounded > total_bytes()) { unlock(); return ERR_OUT_OF_MEMORY; }
    s->bytes += rounded;
    unlock();
    g_ptrs[idx].ptr = (CUdeviceptr)0x7f0000000000ULL + (g_next++ << 21);
    g_ptrs[idx].size = rounded;
    *dptr = g_ptrs[idx].ptr;
    return OK;
}

CUresult cuMemFree_v2(CUdeviceptr ptr) {
    if (!g_init) return ERR_NOT_INITIALIZED;
    for (int i = 0; i < PTRS; i++) {
        if (g_ptrs[i].ptr == ptr) {
            lock();
            struct slot *s = my_slot_locked();
            if (s) s->bytes -= g_ptrs[i].size;
            unlock();
            g_ptrs[i].ptr = 0;
            return OK;
        }
    }
    return ERR_INVALID_VALUE;
}

/* Kernels and synchronisation: nothing runs, every call succeeds (the interposer test counts what comes back). */
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, void *stream, void **params, void **extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)stream; (void)params; (void)extra;
    return g_init && f ? OK : ERR_INVALID_VALUE;
}
CUresult cuModuleLoadData(void **module, const void *image) { *module = (void *)0x2; return g_init && image ? OK : ERR_INVALID_VALUE; }
CUresult cuModuleGetFunction(void **fn, void *module, const char *name) {
    *fn = (void *)0x3; return module && name ? OK : ERR_INVALID_VALUE;
}
CUresult cuCtxSynchronize(void) { return g_init ? OK : ERR_NOT_INITIALIZED; }
CUresult cuStreamSynchronize(void *stream) { (void)stream; return g_init ? OK : ERR_NOT_INITIALIZED; }

/* The CUDA runtime's way in (11.3+): entry points by base name; "cuMemAlloc" is cuMemAlloc_v2, as in the driver. */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
    static const struct { const char *name; void *fn; } table[] = {
        {"cuInit", (void *)cuInit}, {"cuMemAlloc", (void *)cuMemAlloc_v2}, {"cuMemFree", (void *)cuMemFree_v2},
        {"cuLaunchKernel", (void *)cuLaunchKernel}, {"cuCtxSynchronize", (void *)cuCtxSynchronize},
        {"cuStreamSynchronize", (void *)cuStreamSynchronize}, {"cuGetProcAddress", (void *)cuGetProcAddress_v2},
    };
    (void)version; (void)flags;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (!strcmp(table[i].name, symbol)) { *pfn = table[i].fn; if (status) *status = 0; return OK; }
    }
    *pfn = NULL;
    if (status) *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return 500; /* CUDA_ERROR_NOT_FOUND */
}

CUresult cuGetErrorName(CUresult e, const char **s) {
    switch (e) {
    case OK: *s = "CUDA_SUCCESS"; break;
    case ERR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case ERR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case ERR_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case 100: *s = "CUDA_ERROR_NO_DEVICE"; break;
    case ERR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
    default: *s = "CUDA_ERROR_UNKNOWN"; return ERR_INVALID_VALUE;
    }
    return OK;
}
