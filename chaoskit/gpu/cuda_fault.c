/* chaoskit's CUDA fault interposer, loaded with LD_PRELOAD into a process that uses the CUDA driver.
 *
 * While the control file named by $CHAOSKIT_CUDA_FAULT says so, chosen driver calls fail with a given CUresult at
 * a share of calls, or are delayed, without calling the driver; otherwise every call goes through unchanged. The
 * control file (layout: chaoskit/gpu/cuda_fault_ctl.py) is mapped shared, so chaoskit arms and disarms a running
 * process by writing it: no restart after the first. Every call is counted there per kind. An arming carries its
 * expiry (wall-clock seconds, checked only while armed): past it the file acts as disarmed, so a fault outlives
 * neither its run nor a run whose watchdog was killed too.
 *
 * Reached three ways, as frameworks reach the driver:
 *  - direct links (-lcuda): this library's exported cu* functions come first in the lookup order;
 *  - dlsym(handle, "cu...") (ctypes, hand-written loaders): dlsym itself is wrapped and answers with the wrapper;
 *  - cuGetProcAddress[_v2] (the CUDA runtime since 11.3: PyTorch, vLLM): the driver's answer is swapped for the
 *    wrapper of the same entry point (the _ptsz/_ptsa per-thread-stream variants each have their own).
 * Needs no CUDA header: the few types it touches are declared here. Build: cc -shared -fPIC -O2 ... -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;

#define MAGIC 0x43464b43u /* "CKFC" */
#define VERSION 2u
enum { ALLOC, LAUNCH, SYNC, KINDS };

struct rule { uint32_t ppm; int32_t error; uint32_t delay_us; uint32_t pad; };
struct counts { uint64_t calls, failed, delayed, pad; };
struct control {
    uint32_t magic, version, armed, expires; /* expires: Unix seconds, 0 for never */
    struct rule rules[KINDS];
    struct counts counts[KINDS];
};

static struct control *g_ctl;
static time_t g_next_try;
static void *(*g_dlsym)(void *, const char *);

static struct control *control(void) {
    if (g_ctl) return g_ctl;
    const char *path = getenv("CHAOSKIT_CUDA_FAULT");
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (!path || now.tv_sec < g_next_try) return NULL;
    g_next_try = now.tv_sec + 1; /* a control file that appears later is found within a second */
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return NULL;
    struct stat st; /* a short file (one being written) would be a SIGBUS in the served process */
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < (off_t)sizeof(struct control)) {
        close(fd);
        return NULL;
    }
    void *m = mmap(NULL, sizeof(struct control), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return NULL;
    struct control *c = m;
    if (c->magic != MAGIC || c->version != VERSION) { munmap(m, sizeof(struct control)); return NULL; }
    __atomic_store_n(&g_ctl, c, __ATOMIC_RELEASE);
    return c;
}

static uint64_t next_random(void) { /* xorshift64*, one state per thread */
    static __thread uint64_t s;
    if (!s) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        s = (uint64_t)t.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)syscall(SYS_gettid) << 32 ^ (uint64_t)t.tv_sec;
        if (!s) s = 1;
    }
    s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
}

/* 0: make the call; else the error to return instead. Delays the caller first when the rule says so. */
static CUresult decide(int kind) {
    struct control *c = control();
    if (!c || !__atomic_load_n(&c->armed, __ATOMIC_ACQUIRE)) return 0; /* disarmed: not even a shared write */
    uint32_t expires = __atomic_load_n(&c->expires, __ATOMIC_RELAXED);
    if (expires) {
        struct timespec now; /* the coarse clock: a vDSO read, no system call */
        clock_gettime(CLOCK_REALTIME_COARSE, &now);
        if (now.tv_sec >= (time_t)expires) return 0; /* expired: as disarmed */
    }
    __atomic_add_fetch(&c->counts[kind].calls, 1, __ATOMIC_RELAXED);
    uint32_t ppm = __atomic_load_n(&c->rules[kind].ppm, __ATOMIC_RELAXED);
    int32_t error = __atomic_load_n(&c->rules[kind].error, __ATOMIC_RELAXED);
    uint32_t delay_us = __atomic_load_n(&c->rules[kind].delay_us, __ATOMIC_RELAXED);
    if (delay_us) {
        struct timespec d = {delay_us / 1000000, (long)(delay_us % 1000000) * 1000};
        while (nanosleep(&d, &d) != 0) {}
        __atomic_add_fetch(&c->counts[kind].delayed, 1, __ATOMIC_RELAXED);
    }
    if (ppm && error && ((next_random() >> 32) * 1000000u >> 32) < ppm) { /* the high bits: xorshift's best */
        __atomic_add_fetch(&c->counts[kind].failed, 1, __ATOMIC_RELAXED);
        return error;
    }
    return 0;
}

static void init_dlsym(void) {
    void *f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!f) f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!f) f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
    __atomic_store_n(&g_dlsym, (void *(*)(void *, const char *))f, __ATOMIC_RELEASE);
}

static void *real_dlsym(void *handle, const char *name) {
    if (!g_dlsym) init_dlsym();
    return g_dlsym ? g_dlsym(handle, name) : NULL;
}

struct hook { const char *name; const char *base; int kind; void *wrapper; void *real; };
#define N_HOOKS 19 /* the wrapped calls, cuGetProcAddress and its _v2, an end marker */
static struct hook H[N_HOOKS];

static void *g_driver; /* the driver library, once a real entry point of it has been seen */

static void note_driver(void *fn) {
    Dl_info info;
    if (__atomic_load_n(&g_driver, __ATOMIC_ACQUIRE) || !dladdr(fn, &info) || !info.dli_fname) return;
    void *lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    void *none = NULL;
    if (lib && !__atomic_compare_exchange_n(&g_driver, &none, lib, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) dlclose(lib);
}

/* The driver's own function behind hook i: as handed out, else the next definition in the lookup order, else the
 * driver library's own (a driver that takes its entry points' addresses through its GOT hands out our wrappers). */
static void *real_of(int i) {
    void *r = __atomic_load_n(&H[i].real, __ATOMIC_ACQUIRE);
    if (r) return r;
    r = real_dlsym(RTLD_NEXT, H[i].name);
    void *lib = __atomic_load_n(&g_driver, __ATOMIC_ACQUIRE);
    if ((!r || r == H[i].wrapper) && lib) r = real_dlsym(lib, H[i].name);
    if (r == H[i].wrapper) r = NULL;
    if (r) __atomic_store_n(&H[i].real, r, __ATOMIC_RELEASE);
    return r;
}

#define NOT_FOUND 500 /* CUDA_ERROR_NOT_FOUND: the driver has no such entry point */
#define WRAP(idx, kind, name, params, args)                                          \
    CUresult name params {                                                           \
        CUresult (*f) params = (CUresult (*) params)real_of(idx);                    \
        CUresult e = decide(kind);                                                   \
        if (e) return e;                                                             \
        return f ? f args : NOT_FOUND;                                               \
    }

#define LAUNCH_PARAMS (void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                       unsigned shmem, CUstream s, void **params, void **extra)
#define LAUNCH_ARGS (fn, gx, gy, gz, bx, by, bz, shmem, s, params, extra)

WRAP(0, ALLOC, cuMemAlloc_v2, (CUdeviceptr *p, size_t n), (p, n))
WRAP(1, ALLOC, cuMemAllocManaged, (CUdeviceptr *p, size_t n, unsigned fl), (p, n, fl))
WRAP(2, ALLOC, cuMemAllocPitch_v2, (CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned el),
     (p, pitch, w, h, el))
WRAP(3, ALLOC, cuMemAllocAsync, (CUdeviceptr *p, size_t n, CUstream s), (p, n, s))
WRAP(4, ALLOC, cuMemAllocAsync_ptsz, (CUdeviceptr *p, size_t n, CUstream s), (p, n, s))
WRAP(5, ALLOC, cuMemCreate, (unsigned long long *h, size_t n, const void *prop, unsigned long long fl),
     (h, n, prop, fl))
WRAP(6, LAUNCH, cuLaunchKernel, LAUNCH_PARAMS, LAUNCH_ARGS)
WRAP(7, LAUNCH, cuLaunchKernel_ptsz, LAUNCH_PARAMS, LAUNCH_ARGS)
WRAP(8, LAUNCH, cuLaunchKernelEx, (const void *cfg, void *fn, void **params, void **extra), (cfg, fn, params, extra))
WRAP(9, LAUNCH, cuLaunchKernelEx_ptsz, (const void *cfg, void *fn, void **params, void **extra),
     (cfg, fn, params, extra))
WRAP(10, LAUNCH, cuGraphLaunch, (void *g, CUstream s), (g, s))
WRAP(11, LAUNCH, cuGraphLaunch_ptsz, (void *g, CUstream s), (g, s))
WRAP(12, SYNC, cuCtxSynchronize, (void), ())
WRAP(13, SYNC, cuStreamSynchronize, (CUstream s), (s))
WRAP(14, SYNC, cuStreamSynchronize_ptsz, (CUstream s), (s))
WRAP(15, SYNC, cuEventSynchronize, (void *ev), (ev))

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);

#define N_WRAPPED 16
static struct hook H[N_HOOKS] = {
    {"cuMemAlloc_v2", "cuMemAlloc", ALLOC, (void *)cuMemAlloc_v2, 0},
    {"cuMemAllocManaged", "cuMemAllocManaged", ALLOC, (void *)cuMemAllocManaged, 0},
    {"cuMemAllocPitch_v2", "cuMemAllocPitch", ALLOC, (void *)cuMemAllocPitch_v2, 0},
    {"cuMemAllocAsync", "cuMemAllocAsync", ALLOC, (void *)cuMemAllocAsync, 0},
    {"cuMemAllocAsync_ptsz", "cuMemAllocAsync", ALLOC, (void *)cuMemAllocAsync_ptsz, 0},
    {"cuMemCreate", "cuMemCreate", ALLOC, (void *)cuMemCreate, 0},
    {"cuLaunchKernel", "cuLaunchKernel", LAUNCH, (void *)cuLaunchKernel, 0},
    {"cuLaunchKernel_ptsz", "cuLaunchKernel", LAUNCH, (void *)cuLaunchKernel_ptsz, 0},
    {"cuLaunchKernelEx", "cuLaunchKernelEx", LAUNCH, (void *)cuLaunchKernelEx, 0},
    {"cuLaunchKernelEx_ptsz", "cuLaunchKernelEx", LAUNCH, (void *)cuLaunchKernelEx_ptsz, 0},
    {"cuGraphLaunch", "cuGraphLaunch", LAUNCH, (void *)cuGraphLaunch, 0},
    {"cuGraphLaunch_ptsz", "cuGraphLaunch", LAUNCH, (void *)cuGraphLaunch_ptsz, 0},
    {"cuCtxSynchronize", "cuCtxSynchronize", SYNC, (void *)cuCtxSynchronize, 0},
    {"cuStreamSynchronize", "cuStreamSynchronize", SYNC, (void *)cuStreamSynchronize, 0},
    {"cuStreamSynchronize_ptsz", "cuStreamSynchronize", SYNC, (void *)cuStreamSynchronize_ptsz, 0},
    {"cuEventSynchronize", "cuEventSynchronize", SYNC, (void *)cuEventSynchronize, 0},
    {"cuGetProcAddress", "cuGetProcAddress", -1, (void *)cuGetProcAddress, 0},
    {"cuGetProcAddress_v2", "cuGetProcAddress", -1, (void *)cuGetProcAddress_v2, 0},
    {0, 0, 0, 0, 0},
};

static int hook_named(const char *name) {
    if (name[0] != 'c' || name[1] != 'u') return -1;
    for (int i = 0; H[i].name; i++) if (!strcmp(H[i].name, name)) return i;
    return -1;
}

/* The wrapper to hand out for the driver's `real` entry point called `name`; `real` when none applies. */
static void *wrap(int i, void *real) {
    if (i < 0 || !real) return real;
    if (real == H[i].wrapper) return real; /* the driver handed out our own wrapper: real_of finds its function */
    note_driver(real);
    void *none = 0;
    if (__atomic_compare_exchange_n(&H[i].real, &none, real, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) || none == real)
        return H[i].wrapper;
    return real; /* a second, different implementation under one name: leave it alone rather than mix them up */
}

/* glibc resolves RTLD_NEXT from its caller's address: a name that is not ours goes to glibc's dlsym as a tail
 * call (a jump, at -O2), so that another preloaded library's dlsym(RTLD_NEXT, ...) still finds what follows it. */
void *dlsym(void *handle, const char *name) {
    int i = hook_named(name);
    if (i < 0) {
        if (!g_dlsym) init_dlsym();
        void *(*f)(void *, const char *) = g_dlsym;
        return f ? f(handle, name) : NULL;
    }
    return wrap(i, real_dlsym(handle, name));
}

/* cuGetProcAddress answers by base name ("cuMemAlloc" -> cuMemAlloc_v2, "cuLaunchKernel" with per-thread default
 * stream -> cuLaunchKernel_ptsz): find which exported variant the driver's pointer is, and wrap that one. */
static void *swap_proc(const char *symbol, void *pfn) {
    if (!symbol || !pfn) return pfn;
    void *lib = __atomic_load_n(&g_driver, __ATOMIC_ACQUIRE);
    int fallback = -1;
    for (int i = 0; H[i].name; i++) {
        if (strcmp(H[i].base, symbol)) continue;
        if (pfn == H[i].wrapper || (lib && real_dlsym(lib, H[i].name) == pfn)) return wrap(i, pfn);
        if (lib && strcmp(H[i].name, H[i].base) && real_dlsym(lib, H[i].base) == pfn)
            return pfn; /* the unversioned entry point (cuMemAlloc's 32-bit v1): another ABI, left alone */
        if (fallback < 0 && (!H[i].real || H[i].real == pfn)) fallback = i;
    }
    return fallback >= 0 ? wrap(fallback, pfn) : pfn;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    CUresult (*f)(const char *, void **, int, unsigned long long) = real_of(N_WRAPPED);
    if (!f) return NOT_FOUND;
    note_driver((void *)f);
    CUresult e = f(symbol, pfn, version, flags);
    if (e == 0 && pfn) *pfn = swap_proc(symbol, *pfn);
    return e;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
    CUresult (*f)(const char *, void **, int, unsigned long long, int *) = real_of(N_WRAPPED + 1);
    if (!f) return NOT_FOUND;
    note_driver((void *)f);
    CUresult e = f(symbol, pfn, version, flags, status);
    if (e == 0 && pfn) *pfn = swap_proc(symbol, *pfn);
    return e;
}
