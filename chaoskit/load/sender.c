/* chaoskit's native open-loop sender: keep-alive HTTP/1.1 connections on epoll, each request written at its
 * intended time (a timerfd wakes the loop `lead` early, the rest is spent polling), responses parsed
 * (Content-Length, chunked or close-delimited), SSE token events counted as their bytes arrive, and every
 * latency added to HDR histogram counts that Python owns (chaoskit/load/recorder.py's bucket formula).
 * Built and loaded with ctypes by chaoskit/load/native.py; Python schedules, this file only sends. */

#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

enum { API_HTTP, API_OPENAI, API_CHAT, API_TRITON };
enum { E_TIMEOUT, E_CONNECT, E_HTTP, E_STREAM, E_OTHER, E_TRUNCATED, E_N };  /* the order of native.ERRORS */
enum { M_E2E, M_SERVICE, M_TTFT, M_ITL, M_TPOT, M_ALL_E2E, M_ALL_TTFT, M_N }; /* the order of recorder.METRICS */
enum { S_DEAD, S_IDLE, S_BUSY };
enum { C_SIZE, C_DATA, C_CRLF, C_TRAILER };

#define LEAD_MIN 0.0002 /* as chaoskit/load/timer.py: wake 2x the latest late wake-up early, 0.2-2 ms */
#define LEAD_MAX 0.002
#define LEAD_DECAY 0.999
#define LATE_S 0.001
#define HOLD_MAX (1 << 20) /* a header block or an SSE line longer than this is a broken stream */
#define SWEEP_S 0.01 /* how often timeouts are looked for */
#define BURST 16     /* sends in a row before reading, when behind schedule */
#define DENSE 4      /* sends closer than DENSE x lead apart: no polling before each (it would take most of a core
                        that a server on the same host needs); the loop sleeps until the next send instead, */
#define SPARSE_S 0.0002 /* sends at least this far apart (up to 5,000/s) always poll before each: on a busy box
                           the lead grows past a fifth of their gap, and a sleep then sends late */
#define BATCH_S 0.0001 /* but at least this long, so that dense sends leave in small batches (each up to 100 us
                          after its time, a tenth of what counts as late) instead of a timer wake-up each */

typedef struct {
    int family, port;            /* AF_INET or AF_INET6; port in host order */
    unsigned char addr[16];      /* network order */
    int n_payloads;
    const char *const *payloads; /* whole HTTP requests, sent in turn */
    const int *payload_lens;
    int api, stream, cap, max_conns; /* cap: most in flight (0: none) */
    double timeout;
    double slo[4];               /* e2e, ttft, itl, tpot in seconds; <= 0: none */
    uint64_t *counts[M_N];
    int64_t counts_len, sub_bucket_mask, sub_bucket_half_count;
    int unit_magnitude, sub_bucket_half_count_magnitude;
    int64_t lowest, highest;     /* microseconds */
} ck_config;

typedef struct {
    int64_t sent, ok, good, late, tokens, in_flight;
    int64_t errors[E_N];
    double max_late;
} ck_stats;

typedef struct conn {
    int fd, state, connecting, want_out;
    const char *wbuf;
    int wlen, wpos;
    double intended, sent, deadline;
    int headers_done, status, chunked, keep_alive, cstate;
    int64_t length, body_seen, chunk_left;
    char *hold;                  /* the header block, then the unfinished SSE line (or a plain body's tail) */
    int hold_len, hold_cap;
    char line[256];              /* a chunk-size or trailer line */
    int line_len;
    int64_t events, usage;       /* token events seen; the server's own count (-1: none) */
    int done_seen;               /* an SSE `data: [DONE]` came (OpenAI streams end with it) */
    double first, last;
    double *gaps;                /* inter-token gaps of this request, recorded when it succeeds */
    int n_gaps, cap_gaps;
    int error;                   /* -1: none */
} conn;

typedef struct {
    ck_config cfg;
    ck_stats st;
    int ep, tfd, pwait2;            /* pwait2: the alarm is epoll_pwait2's timeout (else the timerfd's) */
    double armed, last_sweep, lead; /* armed: when the alarm is due (0: none); lead: how early it wakes before
                                       a send */
    double last_intended, gap;      /* the latest send's intended time and its gap to the one before */
    conn **all, **idle;
    int n_all, n_idle;
    int64_t seq;
    char *scratch;
    int scratch_cap;
    char rbuf[65536];
} ck;

static const char *const KEYS[] = {"", "\"text\"", "\"content\"", "\"text_output\""};

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void add(ck *c, int m, double seconds) {
    const ck_config *f = &c->cfg;
    double r = round(seconds * 1e6);
    int64_t us = r < (double)f->lowest ? f->lowest : r > (double)f->highest ? f->highest : (int64_t)r;
    int b = 64 - __builtin_clzll((uint64_t)(us | f->sub_bucket_mask)) - f->unit_magnitude -
            f->sub_bucket_half_count_magnitude - 1;
    int64_t i = ((int64_t)(b + 1) << f->sub_bucket_half_count_magnitude) + (us >> (b + f->unit_magnitude)) -
                f->sub_bucket_half_count;
    if (i >= 0 && i < f->counts_len) f->counts[m][i]++;
}

static int grow(char **buf, int *cap, int need) {
    if (need <= *cap) return 0;
    int n = *cap ? *cap : 1024;
    while (n < need) n *= 2;
    char *p = realloc(*buf, (size_t)n);
    if (!p) return -1;
    *buf = p;
    *cap = n;
    return 0;
}

static void watch(ck *c, conn *k, int out) {
    if (k->want_out == out) return;
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = k};
    epoll_ctl(c->ep, EPOLL_CTL_MOD, k->fd, &ev);
    k->want_out = out;
}

static void drop(ck *c, conn *k) { /* close; the struct goes back to the idle stack and reconnects when taken */
    if (k->fd >= 0) {
        close(k->fd); /* also leaves the epoll set */
        k->fd = -1;
    }
    if (k->state == S_BUSY) c->st.in_flight--;
    int was_idle = k->state == S_IDLE;
    k->state = S_DEAD;
    if (!was_idle) c->idle[c->n_idle++] = k;
}

static int dial(ck *c, conn *k) {
    int fd = socket(c->cfg.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof ss);
    if (c->cfg.family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)c->cfg.port);
        memcpy(&a->sin6_addr, c->cfg.addr, 16);
        len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)c->cfg.port);
        memcpy(&a->sin_addr, c->cfg.addr, 4);
        len = sizeof *a;
    }
    if (connect(fd, (struct sockaddr *)&ss, len) < 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = k};
    if (epoll_ctl(c->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
        close(fd);
        return -1;
    }
    k->fd = fd;
    k->connecting = k->want_out = 1;
    return 0;
}

static conn *fresh(ck *c) { /* a new connection struct, not dialled; NULL when no more may be opened */
    if (c->n_all >= c->cfg.max_conns) return NULL;
    conn *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->fd = -1;
    c->all[c->n_all++] = k;
    return k;
}

static conn *take(ck *c) { /* an idle (or reconnecting) connection; NULL when none may be opened */
    return c->n_idle ? c->idle[--c->n_idle] : fresh(c);
}

/* a failed request in the all-requests histograms: at its timeout, or its time if later (recorder.failed_at) */
static void count_failure(ck *c, int err, double intended) {
    double waited = mono() - intended;
    if (waited < c->cfg.timeout) waited = c->cfg.timeout;
    c->st.errors[err]++;
    add(c, M_ALL_E2E, waited);
    if (c->cfg.stream && c->cfg.api != API_HTTP) add(c, M_ALL_TTFT, waited);
}

static void fail(ck *c, conn *k, int err) {
    count_failure(c, err, k->intended);
    drop(c, k);
}

static void try_write(ck *c, conn *k) {
    while (k->wpos < k->wlen) {
        ssize_t w = send(k->fd, k->wbuf + k->wpos, (size_t)(k->wlen - k->wpos), MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                watch(c, k, 1);
                return;
            }
            if (errno == EINTR) continue;
            fail(c, k, E_OTHER);
            return;
        }
        k->wpos += (int)w;
    }
    watch(c, k, 0);
}

/* one request: returns 0 when no connection may be opened now (the send waits) */
static int send_one(ck *c, double intended) {
    conn *k = take(c);
    if (!k) return 0;
    double now = mono();
    c->st.sent++;
    double late = now - intended;
    if (late > LATE_S) c->st.late++;
    if (late > c->st.max_late) c->st.max_late = late;
    if (k->state == S_DEAD && dial(c, k) < 0) {
        count_failure(c, E_CONNECT, intended);
        c->idle[c->n_idle++] = k;
        return 1;
    }
    c->gap = intended - c->last_intended;
    c->last_intended = intended;
    int i = (int)(c->seq++ % c->cfg.n_payloads);
    k->wbuf = c->cfg.payloads[i];
    k->wlen = c->cfg.payload_lens[i];
    k->wpos = 0;
    k->intended = intended;
    k->sent = now;
    k->deadline = now + c->cfg.timeout;
    k->headers_done = k->status = k->chunked = 0;
    k->keep_alive = 1;
    k->length = -1;
    k->body_seen = k->chunk_left = 0;
    k->cstate = C_SIZE;
    k->hold_len = k->line_len = k->n_gaps = 0;
    k->events = 0;
    k->done_seen = 0;
    k->usage = -1;
    k->error = -1;
    k->state = S_BUSY;
    c->st.in_flight++;
    if (!k->connecting) try_write(c, k);
    return 1;
}

static const char *find(const char *p, const char *end, const char *s, size_t n) {
    /* memchr for the first byte, then compare: the needles are short, memmem's setup cost more (perf: 4% of the
       sender's CPU at 50k req/s) */
    if (!n) return NULL;
    while (end - p >= (ptrdiff_t)n) {
        p = memchr(p, s[0], (size_t)(end - p) - n + 1);
        if (!p) return NULL;
        /* the last byte first: the needles start with '"', which JSON has everywhere (a memcmp call at each
           quote was 6% of the sender's CPU at 30k req/s) */
        if (p[n - 1] == s[n - 1] && memcmp(p, s, n) == 0) return p;
        p++;
    }
    return NULL;
}

/* the value after the first `"key" :` at or after p (spaces allowed around the colon), or NULL */
static const char *value_of(const char *p, const char *end, const char *key) {
    size_t n = strlen(key);
    while ((p = find(p, end, key, n))) {
        p += n;
        while (p < end && (*p == ' ' || *p == '\t')) p++;
        if (p < end && *p == ':') {
            for (p++; p < end && (*p == ' ' || *p == '\t');) p++;
            return p;
        }
    }
    return NULL;
}

/* token events in one SSE data payload: each "KEY": "<not empty>" (one per choice) */
static int64_t events(int api, const char *p, const char *end) {
    int64_t count = 0;
    while ((p = value_of(p, end, KEYS[api])))
        if (p + 1 < end && *p == '"' && p[1] != '"') count++;
    return count;
}

static int64_t usage_of(const char *p, const char *end) { /* the last completion_tokens value, -1 if absent */
    int64_t v = -1;
    while ((p = value_of(p, end, "\"completion_tokens\""))) {
        if (p < end && *p >= '0' && *p <= '9') v = 0;
        for (; p < end && *p >= '0' && *p <= '9'; p++) v = v * 10 + (*p - '0');
    }
    return v;
}

static void tokens_at(conn *k, int64_t n, double now) {
    for (int64_t j = 0; j < n; j++) {
        if (k->events++ == 0) {
            k->first = now;
        } else {
            if (k->n_gaps == k->cap_gaps) {
                int cap = k->cap_gaps ? 2 * k->cap_gaps : 64;
                double *g = realloc(k->gaps, (size_t)cap * sizeof *g);
                if (!g) return;
                k->gaps = g;
                k->cap_gaps = cap;
            }
            k->gaps[k->n_gaps++] = now - k->last;
        }
        k->last = now;
    }
}

/* complete SSE lines: returns -1 on an error event (the request fails) */
static int scan(ck *c, conn *k, const char *p, const char *end, double now) {
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        const char *q = p;
        while (q < e && (*q == ' ' || *q == '\t')) q++;
        if (e - q >= 5 && memcmp(q, "data:", 5) == 0) {
            q += 5;
            if (find(q, e, "[DONE]", 6)) {
                k->done_seen = 1;
            } else {
                if (value_of(q, e, "\"error\"")) return -1;
                int64_t u = usage_of(q, e);
                if (u >= 0)
                    k->usage = u;
                else
                    tokens_at(k, events(c->cfg.api, q, e), now);
            }
        }
        p = e + 1;
    }
    return 0;
}

static int hold(conn *k, const char *p, size_t n) {
    if (k->hold_len + (int64_t)n > HOLD_MAX || grow(&k->hold, &k->hold_cap, k->hold_len + (int)n) < 0) return -1;
    memcpy(k->hold + k->hold_len, p, n);
    k->hold_len += (int)n;
    return 0;
}

/* body bytes (de-chunked): SSE lines are scanned as they complete; a plain body keeps only its tail */
static int content(ck *c, conn *k, const char *p, size_t n, double now) {
    if (k->error >= 0 || !n) return 0;
    int sse = c->cfg.stream && c->cfg.api != API_HTTP;
    if (!sse) { /* keep the last 4 KiB: a JSON body's usage object is at its end */
        if (c->cfg.api == API_HTTP) return 0;
        if (n >= 4096) {
            p += n - 4096;
            n = 4096;
            k->hold_len = 0;
        } else if (k->hold_len + (int)n > 4096) {
            int keep = 4096 - (int)n;
            memmove(k->hold, k->hold + k->hold_len - keep, (size_t)keep);
            k->hold_len = keep;
        }
        return hold(k, p, n);
    }
    const char *cut = NULL;
    for (const char *q = p + n; q > p; q--)
        if (q[-1] == '\n') {
            cut = q;
            break;
        }
    if (!cut) return hold(k, p, n);
    int r;
    if (k->hold_len) {
        if (hold(k, p, (size_t)(cut - p)) < 0) return -1;
        r = scan(c, k, k->hold, k->hold + k->hold_len, now);
        k->hold_len = 0;
    } else {
        r = scan(c, k, p, cut, now);
    }
    if (r < 0) return -1;
    return hold(k, cut, (size_t)(p + n - cut));
}

static void finish(ck *c, conn *k, double now) {
    const ck_config *f = &c->cfg;
    int sse = f->stream && f->api != API_HTTP;
    if (k->error >= 0) {
        fail(c, k, k->error);
        return;
    }
    if (sse && (f->api == API_OPENAI || f->api == API_CHAT) && !k->done_seen) {
        fail(c, k, E_TRUNCATED); /* the body ended cleanly, without data: [DONE] (clients.needs_done) */
        return;
    }
    if (!sse && f->api != API_HTTP) k->usage = usage_of(k->hold, k->hold + k->hold_len);
    int64_t tokens = k->usage >= 0 ? k->usage : k->events;
    if (!sse && tokens < 1) tokens = 1;
    double end = sse && k->events ? k->last : now, e2e = end - k->intended, ttft = -1, max_gap = 0;
    add(c, M_E2E, e2e);
    add(c, M_ALL_E2E, e2e);
    add(c, M_SERVICE, end - k->sent);
    int good = !(f->slo[0] > 0 && e2e > f->slo[0]);
    if (sse && k->events) {
        ttft = k->first - k->intended;
        add(c, M_TTFT, ttft);
        add(c, M_ALL_TTFT, ttft);
        if (tokens > 1) {
            double tpot = (e2e - ttft) / (double)(tokens - 1);
            add(c, M_TPOT, tpot);
            if (f->slo[3] > 0 && tpot > f->slo[3]) good = 0;
        }
    }
    for (int j = 0; j < k->n_gaps; j++) {
        add(c, M_ITL, k->gaps[j]);
        if (k->gaps[j] > max_gap) max_gap = k->gaps[j];
    }
    if (f->slo[1] > 0 && (ttft < 0 || ttft > f->slo[1])) good = 0;
    if (f->slo[2] > 0 && max_gap > f->slo[2]) good = 0;
    c->st.ok++;
    c->st.good += good;
    c->st.tokens += tokens;
    if (!k->keep_alive) {
        drop(c, k);
        return;
    }
    k->state = S_IDLE;
    c->st.in_flight--;
    c->idle[c->n_idle++] = k;
}

/* the status line and headers; 0 when done, -1 when malformed */
static int head(conn *k, const char *p, const char *end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *sp = nl ? memchr(p, ' ', (size_t)(nl - p)) : NULL;
    if (!sp || end - p < 5 || memcmp(p, "HTTP/", 5) != 0) return -1;
    k->status = atoi(sp + 1);
    if (k->status < 100) return -1;
    for (p = nl + 1; p < end; p = nl + 1) {
        nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) nl = end;
        const char *colon = memchr(p, ':', (size_t)(nl - p));
        if (!colon) continue;
        const char *v = colon + 1, *ve = nl;
        while (v < ve && (*v == ' ' || *v == '\t')) v++;
        while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t')) ve--;
        size_t name = (size_t)(colon - p);
        if (name == 14 && strncasecmp(p, "content-length", 14) == 0) {
            k->length = strtoll(v, NULL, 10);
        } else if (name == 17 && strncasecmp(p, "transfer-encoding", 17) == 0) {
            for (const char *q = v; q + 7 <= ve; q++)
                if (strncasecmp(q, "chunked", 7) == 0) k->chunked = 1;
        } else if (name == 10 && strncasecmp(p, "connection", 10) == 0) {
            if (ve - v == 5 && strncasecmp(v, "close", 5) == 0) k->keep_alive = 0;
        }
    }
    if (k->chunked) k->length = -1;
    if (k->length < 0 && !k->chunked) k->keep_alive = 0; /* the body ends when the server closes */
    if (k->status >= 400) k->error = E_HTTP;
    k->headers_done = 1;
    return 0;
}

/* body bytes as they arrive; 1 when the response is complete, -1 when it is broken */
static int body(ck *c, conn *k, const char *p, const char *end, double now) {
    if (!k->chunked) {
        size_t n = (size_t)(end - p);
        if (k->length >= 0 && (int64_t)n > k->length - k->body_seen) n = (size_t)(k->length - k->body_seen);
        if (content(c, k, p, n, now) < 0) return -1;
        k->body_seen += (int64_t)n;
        return k->length >= 0 && k->body_seen >= k->length;
    }
    while (p < end) {
        if (k->cstate == C_SIZE || k->cstate == C_TRAILER) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t n = (size_t)((nl ? nl : end) - p), room = sizeof k->line - 1 - (size_t)k->line_len;
            if (n > room) {
                if (k->cstate == C_SIZE) return -1;
                n = room; /* a long trailer line: only whether it is empty matters */
            }
            memcpy(k->line + k->line_len, p, n);
            k->line_len += (int)n;
            if (!nl) return 0;
            p = nl + 1;
            int len = k->line_len;
            while (len && (k->line[len - 1] == '\r' || k->line[len - 1] == ' ')) len--;
            k->line[len] = 0;
            k->line_len = 0;
            if (k->cstate == C_TRAILER) {
                if (!len) return 1;
                continue;
            }
            char *stop;
            k->chunk_left = strtoll(k->line, &stop, 16);
            if (stop == k->line || k->chunk_left < 0) return -1;
            k->cstate = k->chunk_left ? C_DATA : C_TRAILER;
        } else if (k->cstate == C_DATA) {
            size_t n = (size_t)(end - p);
            if ((int64_t)n > k->chunk_left) n = (size_t)k->chunk_left;
            if (content(c, k, p, n, now) < 0) return -1;
            p += n;
            k->chunk_left -= (int64_t)n;
            if (!k->chunk_left) k->cstate = C_CRLF;
        } else { /* the CRLF after a chunk's data */
            if (*p == '\n') k->cstate = C_SIZE;
            else if (*p != '\r') return -1;
            p++;
        }
    }
    return 0;
}

static void readable(ck *c, conn *k) {
    ssize_t r = recv(k->fd, c->rbuf, sizeof c->rbuf, 0);
    double now = mono();
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (k->state != S_BUSY) { /* an idle keep-alive connection closed (or talked out of turn) */
        drop(c, k);
        return;
    }
    if (r <= 0) {
        if (k->headers_done && k->length < 0 && !k->chunked)
            finish(c, k, now); /* a close-delimited body */
        else if (k->headers_done && k->status < 400 && c->cfg.stream && c->cfg.api != API_HTTP)
            fail(c, k, E_TRUNCATED); /* a stream cut before its end (the python sender's ClientPayloadError) */
        else
            fail(c, k, E_OTHER);
        return;
    }
    const char *p = c->rbuf, *end = c->rbuf + r;
    if (!k->headers_done) {
        if (hold(k, p, (size_t)r) < 0) {
            fail(c, k, E_STREAM);
            return;
        }
        const char *h = find(k->hold, k->hold + k->hold_len, "\r\n\r\n", 4);
        if (!h) return;
        if (head(k, k->hold, h + 2) < 0) {
            fail(c, k, E_STREAM);
            return;
        }
        int rest = k->hold_len - (int)(h + 4 - k->hold);
        if (grow(&c->scratch, &c->scratch_cap, rest + 1) < 0) {
            fail(c, k, E_OTHER);
            return;
        }
        memcpy(c->scratch, h + 4, (size_t)rest);
        k->hold_len = 0;
        p = c->scratch;
        end = c->scratch + rest;
        if (k->status == 204 || k->status == 304 || k->length == 0) {
            finish(c, k, now);
            return;
        }
    }
    int done = body(c, k, p, end, now);
    if (done < 0) {
        k->keep_alive = 0;
        fail(c, k, E_STREAM);
    } else if (done) {
        finish(c, k, now);
    }
}

static void connected(ck *c, conn *k) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(k->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
    if (err) {
        if (k->state == S_BUSY)
            fail(c, k, E_CONNECT);
        else
            drop(c, k);
        return;
    }
    k->connecting = 0;
    if (k->state == S_BUSY)
        try_write(c, k);
    else
        watch(c, k, 0);
}

static void arm(ck *c, double when) {
    if (when == c->armed) return;
    c->armed = when;
    if (c->pwait2) return; /* the next wait's timeout: no system call to set it */
    struct itimerspec t = {0};
    int64_t ns = (int64_t)(when * 1e9);
    if (ns < 1) ns = 1;
    t.it_value.tv_sec = ns / 1000000000;
    t.it_value.tv_nsec = ns % 1000000000;
    timerfd_settime(c->tfd, TFD_TIMER_ABSTIME, &t, NULL);
}

static void rang(ck *c) { /* the alarm went off: learn how late wake-ups come */
    if (c->armed > 0) {
        double late = mono() - c->armed, lead = c->lead * LEAD_DECAY;
        if (2 * late > lead) lead = 2 * late;
        c->lead = lead < LEAD_MIN ? LEAD_MIN : lead > LEAD_MAX ? LEAD_MAX : lead;
    }
    c->armed = 0;
}

/* epoll_wait; timeout_ms < 0 waits for an event or the alarm. With epoll_pwait2 (Linux 5.11) the alarm is the
 * wait's own timeout in nanoseconds: one system call a sleep where a timerfd takes three (settime, wait, read) */
static int wait_events(ck *c, struct epoll_event *evs, int max, int timeout_ms) {
#ifdef SYS_epoll_pwait2
    if (c->pwait2 && c->armed > 0 && timeout_ms < 0) {
        double left = c->armed - mono();
        int64_t ns = left > 0 ? (int64_t)(left * 1e9) : 0;
        struct timespec t = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
        int n = (int)syscall(SYS_epoll_pwait2, c->ep, evs, max, &t, NULL, 0);
        if (n >= 0 || errno != ENOSYS) {
            if (n >= 0 && mono() >= c->armed) rang(c); /* due by now, as a timerfd would have fired */
            return n;
        }
        c->pwait2 = 0; /* an older kernel: the timerfd from now on */
        double when = c->armed;
        c->armed = 0;
        arm(c, when);
    }
#endif
    int n = epoll_wait(c->ep, evs, max, timeout_ms);
    if (c->pwait2 && n >= 0 && c->armed > 0 && mono() >= c->armed) rang(c);
    return n;
}

static void poll_once(ck *c, int timeout_ms) {
    struct epoll_event evs[256];
    int n = wait_events(c, evs, 256, timeout_ms);
    for (int i = 0; i < n; i++) {
        conn *k = evs[i].data.ptr;
        if (!k) { /* the timerfd alarm */
            uint64_t x;
            if (read(c->tfd, &x, sizeof x) == sizeof x) rang(c);
            continue;
        }
        if (k->fd < 0) continue; /* dropped earlier in this batch */
        uint32_t e = evs[i].events;
        if (k->connecting) {
            if (e & (EPOLLOUT | EPOLLERR | EPOLLHUP)) connected(c, k);
            continue;
        }
        if ((e & EPOLLOUT) && k->state == S_BUSY && k->wpos < k->wlen) try_write(c, k);
        if (k->fd >= 0 && (e & (EPOLLIN | EPOLLHUP | EPOLLERR))) readable(c, k);
    }
}

static void sweep(ck *c, double now) {
    for (int i = 0; i < c->n_all; i++) {
        conn *k = c->all[i];
        if (k->state == S_BUSY && k->deadline < now) fail(c, k, E_TIMEOUT);
    }
    c->last_sweep = now;
}

/* ------------------------------------------------------------------------------------------------ API */

ck *ck_new(const ck_config *cfg) {
    ck *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cfg = *cfg;
    c->lead = LEAD_MAX; /* until wake-ups prove punctual */
#ifdef SYS_epoll_pwait2
    c->pwait2 = 1;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* this thread's timeouts exact, as a timerfd's (the default slack
                                               lets a 100 us sleep end up to 50 us late) */
#endif
    c->ep = epoll_create1(EPOLL_CLOEXEC);
    c->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    c->all = calloc((size_t)cfg->max_conns, sizeof *c->all);
    c->idle = calloc((size_t)cfg->max_conns, sizeof *c->idle);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (c->ep < 0 || c->tfd < 0 || !c->all || !c->idle || epoll_ctl(c->ep, EPOLL_CTL_ADD, c->tfd, &ev) < 0) {
        if (c->ep >= 0) close(c->ep);
        if (c->tfd >= 0) close(c->tfd);
        free(c->all);
        free(c->idle);
        free(c);
        return NULL;
    }
    return c;
}

ck_stats *ck_stats_of(ck *c) { return &c->st; }

/* one value into metric m's histogram, as a completed request does (the recorder's tests compare buckets) */
void ck_add(ck *c, int m, double seconds) {
    if (m >= 0 && m < M_N) add(c, m, seconds);
}

/* open up to n connections and wait (at most `timeout` s) until they are connected */
void ck_warm(ck *c, int n, double timeout) {
    for (int i = 0; i < n; i++) {
        conn *k = fresh(c); /* not take(): it would hand back the one just dialled, and its socket would leak */
        if (!k) break;
        if (dial(c, k) < 0) {
            c->idle[c->n_idle++] = k;
            break;
        }
        k->state = S_IDLE;
        c->idle[c->n_idle++] = k;
    }
    double stop = mono() + timeout;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < c->n_all; i++) pending += c->all[i]->fd >= 0 && c->all[i]->connecting;
        if (!pending || mono() >= stop) return;
        poll_once(c, 10);
    }
}

/* send offsets[i] (seconds after monotonic t0) in turn until `until` (monotonic) or until all are sent; returns
 * how many were sent (the rest were not due, or waited for a free slot). Also reads responses, expires timeouts. */
int64_t ck_run(ck *c, double t0, const double *offsets, int64_t n, double until) {
    int64_t i = 0;
    for (;;) {
        double now = mono();
        int burst = 0; /* behind schedule, sends alternate with reading: completions free connections (else every
                          catch-up send would open a new one, each slower than the gap between sends) */
        while (i < n && burst < BURST && t0 + offsets[i] <= now && (!c->cfg.cap || c->st.in_flight < c->cfg.cap) &&
               send_one(c, t0 + offsets[i])) {
            i++;
            burst++;
            now = mono();
        }
        if (burst == BURST) {
            poll_once(c, 0);
            if (mono() >= until) return i;
            continue;
        }
        if (now >= until || (n && i == n)) return i; /* all sent: Python hands over more */
        if (now - c->last_sweep >= SWEEP_S) sweep(c, now);
        double next = i < n ? t0 + offsets[i] : INFINITY;
        if (next <= now) { /* due but waiting for a slot: a completion frees one */
            arm(c, until < now + SWEEP_S ? until : now + SWEEP_S);
            poll_once(c, -1);
        } else if (next - c->lead <= now && (c->gap >= SPARSE_S || c->gap > DENSE * c->lead)) {
            poll_once(c, 0); /* close to a send: poll, do not sleep (a wake-up can come late) */
        } else if (next - c->lead <= now) { /* dense sends: sleep until the next, BATCH_S at least */
            double wake = next < now + BATCH_S ? now + BATCH_S : next;
            arm(c, wake < until ? wake : until);
            poll_once(c, -1);
        } else {
            double wake = next - c->lead;
            arm(c, wake < until ? wake : until);
            poll_once(c, -1);
        }
    }
}

void ck_free(ck *c) {
    for (int i = 0; i < c->n_all; i++) {
        if (c->all[i]->fd >= 0) close(c->all[i]->fd);
        free(c->all[i]->hold);
        free(c->all[i]->gaps);
        free(c->all[i]);
    }
    close(c->ep);
    close(c->tfd);
    free(c->all);
    free(c->idle);
    free(c->scratch);
    free(c);
}
