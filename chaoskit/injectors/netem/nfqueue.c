/* chaoskit's netem without sch_netem: a userspace packet scheduler behind a netfilter queue (NFQUEUE).
 * The kernel holds each queued packet until this program gives its verdict; the verdict is given when the
 * packet's time comes (CLOCK_MONOTONIC), so holding = delay. Loss is a DROP verdict, corruption an ACCEPT with
 * one bit flipped in the payload, a duplicate a copy sent through a raw socket (marked so the rule skips it),
 * reordering an immediate verdict, rate a serialisation time per packet. With `detach` (egress) a held packet
 * is a copy: the original is dropped at once and the copy sent through the raw socket when its time comes.
 * The decisions follow sch_netem's (the iproute2 distribution tables, gap-based reordering, the order of loss,
 * duplication and corruption) but for correlation, which keeps the asked rates here (corr_next).
 *
 * Run by chaoskit/injectors/netem/nfqueue.py as
 *   netemq TOKEN NS_PATH key=value...     (keys: see parse_arg)
 * It enters the namespace, binds the first free queue number from `queue`, prints `ready N` and serves until
 * SIGTERM, the `until` epoch or its namespace leaving NS_PATH; then it lets what it holds go at once and exits.
 * The nft rule uses the queue's bypass flag: with no program bound (this one killed), packets pass. Counters are
 * written as JSON to `stats`. The random draws are seeded from getrandom(2), or from $CHAOSKIT_NETEM_SEED (an
 * integer: the same packets then get the same decisions; tests). */

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define NS 1000000000LL
#define DIST_SCALE 8192 /* the iproute2 tables' unit (NETEM_DIST_SCALE) */
#define TRY_QUEUES 64
#define RX_BATCH 64
#define RX_SIZE 70000 /* a whole packet (up to 64 KiB) and its attributes */
#define TX_SIZE (1 << 20)
#define LATE_BUCKETS 20000 /* release lateness histogram, 1 us buckets */

typedef struct {
    int64_t delay, jitter;                          /* ns */
    uint64_t loss, dup, corrupt, reorder;           /* probability scaled to 2^32 */
    uint32_t delay_corr, loss_corr, dup_corr, corrupt_corr, reorder_corr; /* rho: see corr_next */
    uint32_t gap, limit, mark, copy, detach;        /* detach: hold a copy, free the original (egress) */
    int rt;                                         /* SCHED_FIFO priority (0: leave the scheduler alone) */
    int64_t lead; /* ns: wake this early and busy-poll the rest (0: sleep to the due time; at SCHED_FIFO a spin
                   * takes the CPU from everyone else, for ~15 us of median precision) */
    uint64_t rate;                                  /* bytes/s; 0: none */
    const char *dist, *stats, *dev;                 /* dev: the egress interface the copies leave by */
    double until;                                   /* CLOCK_REALTIME seconds */
    int queue;
} config;

typedef struct {
    int64_t due;
    uint64_t seq;
    uint32_t id, len;
    int kind, v6;
    unsigned char *data;
} item;

enum { K_ACCEPT, K_MANGLED, K_COPY };

typedef struct { uint32_t last, rho; } corr;

static config cfg = {.limit = 1000, .mark = 0x4e51, .queue = 20000, .rt = 10, .lead = 0};
static int realtime;
static volatile sig_atomic_t stopping;
static int nl = -1, raw4 = -1, raw6 = -1, qnum = -1;
static int16_t *table;
static size_t table_len;
static corr c_delay, c_loss, c_dup, c_corrupt, c_reorder;
static uint64_t rng[4];
static item *heap;
static size_t held, heap_cap;
static uint64_t seqno;
static uint32_t counter;
static int64_t last_due;
static unsigned char *txbuf;
static size_t txlen;
static uint64_t late_hist[LATE_BUCKETS + 1];
static struct {
    uint64_t seen, passed, delayed, dropped, duplicated, corrupted, reordered, overflow, max_held, nl_errors,
        copy_errors;
    int64_t max_late;
} st;

/* ---------------------------------------------------------------- time and randomness */

static int64_t mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * NS + t.tv_nsec;
}

static double wall(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rand64(void) { /* xoshiro256** */
    uint64_t out = rotl(rng[1] * 5, 7) * 9, t = rng[1] << 17;
    rng[2] ^= rng[0];
    rng[3] ^= rng[1];
    rng[1] ^= rng[2];
    rng[0] ^= rng[3];
    rng[2] ^= t;
    rng[3] = rotl(rng[3], 45);
    return out;
}

static uint32_t rand32(void) { return (uint32_t)(rand64() >> 32); }

/* a correlated uniform number: the last one again with chance rho, else a fresh one. Each draw stays uniform,
 * so a 10% loss stays 10% whatever the correlation, and consecutive draws correlate by rho (an event follows an
 * event with chance rho + (1 - rho) p). sch_netem's weighted mean of the fresh and the last number narrows the
 * distribution instead: 10% loss at 25% correlation drops ~1.8% of packets there. */
static uint32_t corr_next(corr *c) {
    if (c->rho && rand32() < c->rho)
        return c->last;
    c->last = rand32();
    return c->last;
}

static int chance(uint64_t p, corr *c) { return p && (uint64_t)corr_next(c) < p; }

static int64_t draw_delay(void) {
    if (!cfg.jitter)
        return cfg.delay;
    uint32_t r = corr_next(&c_delay);
    int64_t d;
    if (!table)
        d = cfg.delay - cfg.jitter + (int64_t)(((uint64_t)r * (uint64_t)(2 * cfg.jitter)) >> 32);
    else
        d = cfg.delay + (int64_t)table[r % table_len] * cfg.jitter / DIST_SCALE;
    return d < 0 ? 0 : d;
}

/* ---------------------------------------------------------------- the held packets: a min-heap by due time */

static int before(const item *a, const item *b) { return a->due < b->due || (a->due == b->due && a->seq < b->seq); }

static void heap_push(item it) {
    if (held == heap_cap) {
        heap_cap = heap_cap ? 2 * heap_cap : 1024;
        heap = realloc(heap, heap_cap * sizeof(item));
        if (!heap) {
            perror("netemq: realloc");
            exit(1);
        }
    }
    size_t i = held++;
    it.seq = seqno++;
    while (i && before(&it, &heap[(i - 1) / 2])) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = it;
    if (held > st.max_held)
        st.max_held = held;
}

static item heap_pop(void) {
    item top = heap[0], last = heap[--held];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= held)
            break;
        if (c + 1 < held && before(&heap[c + 1], &heap[c]))
            c++;
        if (!before(&heap[c], &last))
            break;
        heap[i] = heap[c];
        i = c;
    }
    if (held)
        heap[i] = last;
    return top;
}

/* ---------------------------------------------------------------- netlink */

static size_t put_attr(unsigned char *p, uint16_t type, const void *data, size_t len) {
    struct nlattr *a = (struct nlattr *)p;
    a->nla_type = type;
    a->nla_len = (uint16_t)(NLA_HDRLEN + len);
    memcpy(p + NLA_HDRLEN, data, len);
    memset(p + NLA_HDRLEN + len, 0, NLA_ALIGN(len) - len);
    return NLA_HDRLEN + NLA_ALIGN(len);
}

/* start a queue message of `type` at p; returns its header (the caller adds attributes and sets nlmsg_len) */
static struct nlmsghdr *start_msg(unsigned char *p, uint16_t type, uint16_t flags, int queue) {
    struct nlmsghdr *h = (struct nlmsghdr *)p;
    h->nlmsg_len = NLMSG_LENGTH(sizeof(struct nfgenmsg));
    h->nlmsg_type = (NFNL_SUBSYS_QUEUE << 8) | type;
    h->nlmsg_flags = NLM_F_REQUEST | flags;
    h->nlmsg_seq = (uint32_t)seqno++;
    h->nlmsg_pid = 0;
    struct nfgenmsg *g = NLMSG_DATA(h);
    g->nfgen_family = AF_UNSPEC;
    g->version = NFNETLINK_V0;
    g->res_id = htons((uint16_t)queue);
    return h;
}

/* send one config message and wait for its acknowledgement: 0 or -errno */
static int config_msg(int queue, uint16_t attr, const void *data, size_t len) {
    unsigned char buf[256];
    struct nlmsghdr *h = start_msg(buf, NFQNL_MSG_CONFIG, NLM_F_ACK, queue);
    h->nlmsg_len += (uint32_t)put_attr(buf + h->nlmsg_len, attr, data, len);
    if (send(nl, buf, h->nlmsg_len, 0) < 0)
        return -errno;
    for (;;) {
        unsigned char rx[8192];
        ssize_t n = recv(nl, rx, sizeof rx, 0);
        if (n < 0)
            return -errno;
        for (struct nlmsghdr *r = (struct nlmsghdr *)rx; NLMSG_OK(r, (size_t)n); r = NLMSG_NEXT(r, n))
            if (r->nlmsg_type == NLMSG_ERROR && r->nlmsg_seq == h->nlmsg_seq)
                return ((struct nlmsgerr *)NLMSG_DATA(r))->error;
    }
}

static int bind_queue(void) {
    struct nfqnl_msg_config_cmd cmd = {.command = NFQNL_CFG_CMD_BIND};
    for (int q = cfg.queue; q < cfg.queue + TRY_QUEUES; q++) {
        int err = config_msg(q, NFQA_CFG_CMD, &cmd, sizeof cmd);
        if (!err)
            return q;
        if (err != -EBUSY && err != -EEXIST && err != -EPERM) {
            fprintf(stderr, "netemq: binding queue %d: %s\n", q, strerror(-err));
            return -1;
        }
    }
    fprintf(stderr, "netemq: queues %d-%d are all taken\n", cfg.queue, cfg.queue + TRY_QUEUES - 1);
    return -1;
}

static int setup_queue(void) {
    /* whole packets to duplicate or corrupt; for rate alone a few bytes, for the length (NFQA_CAP_LEN) that
     * comes with a packet copy only; else the metadata */
    uint32_t range = cfg.copy ? 0xffff : cfg.rate ? 64 : 0;
    struct nfqnl_msg_config_params params = {.copy_range = htonl(range),
                                             .copy_mode = range ? NFQNL_COPY_PACKET : NFQNL_COPY_META};
    uint32_t maxlen = htonl(cfg.limit);
    int err = config_msg(qnum, NFQA_CFG_PARAMS, &params, sizeof params);
    if (!err)
        err = config_msg(qnum, NFQA_CFG_QUEUE_MAXLEN, &maxlen, sizeof maxlen);
    if (err)
        fprintf(stderr, "netemq: configuring queue %d: %s\n", qnum, strerror(-err));
    return err;
}

static void tx_flush(void) {
    if (txlen && send(nl, txbuf, txlen, 0) < 0)
        st.nl_errors++;
    txlen = 0;
}

static void verdict(uint32_t id, uint32_t v, const unsigned char *data, uint32_t len) {
    if (txlen + NLMSG_SPACE(sizeof(struct nfgenmsg)) + 64 + NLA_ALIGN(len) > TX_SIZE)
        tx_flush();
    struct nlmsghdr *h = start_msg(txbuf + txlen, NFQNL_MSG_VERDICT, 0, qnum);
    struct nfqnl_msg_verdict_hdr vh = {.verdict = htonl(v), .id = htonl(id)};
    h->nlmsg_len += (uint32_t)put_attr(txbuf + txlen + h->nlmsg_len, NFQA_VERDICT_HDR, &vh, sizeof vh);
    if (data)
        h->nlmsg_len += (uint32_t)put_attr(txbuf + txlen + h->nlmsg_len, NFQA_PAYLOAD, data, len);
    txlen += NLMSG_ALIGN(h->nlmsg_len);
}

/* ---------------------------------------------------------------- copies (duplicates) */

/* a socket for copies (header included), marked for the rule to let them pass; on egress bound to the
 * interface (link-local and multicast destinations need it) and allowed to broadcast */
static int raw_socket(int family) {
    int fd = socket(family, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW), big = 16 << 20, one = 1;
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big);
        setsockopt(fd, SOL_SOCKET, SO_BROADCAST, &one, sizeof one);
    }
    if (fd >= 0 && cfg.detach && cfg.dev && setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, cfg.dev, strlen(cfg.dev))) {
        close(fd);
        return -1;
    }
    if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_MARK, &cfg.mark, sizeof cfg.mark) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* copies due together leave in one sendmmsg per family; their buffers are freed once sent */
#define COPY_BATCH 64
static struct {
    struct mmsghdr msg[COPY_BATCH];
    struct iovec iov[COPY_BATCH];
    struct sockaddr_in6 to[COPY_BATCH]; /* a sockaddr_in fits in it */
    unsigned char *data[COPY_BATCH];
    int n;
} copies[2];

static void copies_flush(int v6) {
    int fd = v6 ? raw6 : raw4, sent = 0;
    while (sent < copies[v6].n) {
        int r = fd < 0 ? -1 : sendmmsg(fd, copies[v6].msg + sent, (unsigned)(copies[v6].n - sent), 0);
        if (r <= 0) { /* this one fails: count it, go on with the rest */
            st.copy_errors++;
            r = 1;
        }
        sent += r;
    }
    for (int i = 0; i < copies[v6].n; i++)
        free(copies[v6].data[i]);
    copies[v6].n = 0;
}

/* send a copy of an IP packet as it is (header included) to its destination, marked for the rule to skip;
 * takes `d` (freed once sent) */
static void send_copy(unsigned char *d, uint32_t len, int v6) {
    if (len < (v6 ? 40u : 20u)) {
        st.copy_errors++;
        free(d);
        return;
    }
    if (copies[v6].n == COPY_BATCH)
        copies_flush(v6);
    int i = copies[v6].n++;
    struct sockaddr_in6 *to = &copies[v6].to[i];
    memset(to, 0, sizeof *to);
    if (v6) {
        to->sin6_family = AF_INET6;
        memcpy(&to->sin6_addr, d + 24, 16);
    } else {
        struct sockaddr_in *to4 = (struct sockaddr_in *)to;
        to4->sin_family = AF_INET;
        memcpy(&to4->sin_addr, d + 16, 4);
    }
    copies[v6].iov[i] = (struct iovec){d, len};
    copies[v6].data[i] = d;
    socklen_t tolen = v6 ? sizeof *to : sizeof(struct sockaddr_in);
    copies[v6].msg[i].msg_hdr =
        (struct msghdr){.msg_name = to, .msg_namelen = tolen, .msg_iov = &copies[v6].iov[i], .msg_iovlen = 1};
}

static void flush_all(void) {
    copies_flush(0);
    copies_flush(1);
    tx_flush();
}

/* ---------------------------------------------------------------- the scheduler */

static void note_late(int64_t late) {
    int64_t us = late / 1000;
    late_hist[us < 0 ? 0 : us > LATE_BUCKETS ? LATE_BUCKETS : us]++;
    if (late > st.max_late)
        st.max_late = late;
}

/* its verdict or its copy, queued (flush_all sends them) */
static void release(item *it, int64_t now) {
    note_late(now - it->due);
    if (it->kind == K_COPY) {
        send_copy(it->data, it->len, it->v6);
        return;
    }
    verdict(it->id, NF_ACCEPT, it->kind == K_MANGLED ? it->data : NULL, it->len);
    free(it->data);
}

static void release_due(int64_t now) {
    while (held && heap[0].due <= now) {
        item it = heap_pop();
        release(&it, now);
    }
    flush_all();
}

/* when a packet of `len` bytes arriving `now` is sent: netem's delay, then the rate's serialisation */
static int64_t due_time(int64_t now, uint32_t len) {
    int64_t t = now + draw_delay();
    if (!cfg.rate)
        return t;
    if (last_due > t)
        t = last_due;
    t += (int64_t)((double)len * NS / (double)cfg.rate);
    last_due = t;
    return t;
}

static void flip_bit(unsigned char *d, uint32_t len, int v6) {
    uint32_t hdr = v6 ? 40 : (uint32_t)(d[0] & 0x0f) * 4;
    if (hdr >= len)
        hdr = 0;
    uint64_t r = rand64();
    d[hdr + (uint32_t)(r % (len - hdr))] ^= (unsigned char)(1u << ((r >> 32) % 8));
}

static unsigned char *copy_of(const unsigned char *d, uint32_t len) {
    unsigned char *p = malloc(len ? len : 1);
    if (!p) {
        perror("netemq: malloc");
        exit(1);
    }
    memcpy(p, d, len);
    return p;
}

/* egress: keep a copy of the packet (sent later through the raw socket) and let the kernel free the original
 * now, as sch_netem orphans what it holds: a held original still counts against its socket, and TCP Small
 * Queues would hold a delayed sender to a few packets per delay. 0 when the limit is reached (dropped). */
static int detach(item *it, const unsigned char *d) {
    verdict(it->id, NF_DROP, NULL, 0);
    if (held >= cfg.limit) {
        free(it->data);
        return 0;
    }
    if (it->kind == K_ACCEPT)
        it->data = copy_of(d, it->len);
    it->kind = K_COPY;
    return 1;
}

static void on_packet(uint32_t id, const unsigned char *d, uint32_t dlen, uint32_t plen, int v6, int64_t now) {
    st.seen++;
    if (stopping) {
        verdict(id, NF_ACCEPT, NULL, 0);
        return;
    }
    if (d && plen != dlen) /* a truncated copy (over 64 KiB): never sent or spliced back in place of the packet */
        d = NULL;
    int copies = 1 + (d && chance(cfg.dup, &c_dup));
    if (chance(cfg.loss, &c_loss))
        copies--;
    if (!copies) {
        st.dropped++;
        verdict(id, NF_DROP, NULL, 0);
        return;
    }
    item it = {.id = id, .len = dlen, .v6 = v6, .kind = K_ACCEPT};
    if (copies == 2 && held < 2 * (size_t)cfg.limit) {
        st.duplicated++;
        item c = {.kind = K_COPY, .len = dlen, .v6 = v6, .data = copy_of(d, dlen), .due = due_time(now, plen)};
        heap_push(c);
    }
    if (d && chance(cfg.corrupt, &c_corrupt) && dlen) {
        st.corrupted++;
        it.kind = K_MANGLED;
        it.data = copy_of(d, dlen);
        flip_bit(it.data, dlen, v6);
    }
    int delays = cfg.delay || cfg.jitter || cfg.rate;
    if (delays && !(cfg.reorder && counter + 1 >= cfg.gap && chance(cfg.reorder, &c_reorder))) {
        counter++;
        it.due = due_time(now, plen);
    } else {
        if (cfg.reorder && delays)
            st.reordered++;
        counter = 0;
        it.due = now;
    }
    if (it.due <= now) {
        st.passed++;
        release(&it, now);
        return;
    }
    if (cfg.detach && d && !detach(&it, d)) {
        st.overflow++;
        return;
    }
    st.delayed++;
    heap_push(it);
}

/* one message from the kernel: a queued packet, or an error answer to a verdict */
static void on_message(struct nlmsghdr *h, int64_t now) {
    if (h->nlmsg_type == NLMSG_ERROR) {
        if (((struct nlmsgerr *)NLMSG_DATA(h))->error)
            st.nl_errors++;
        return;
    }
    if (h->nlmsg_type != ((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET))
        return;
    const unsigned char *data = NULL;
    uint32_t dlen = 0, caplen = 0, id = 0;
    int v6 = 0, have_id = 0;
    int len = (int)h->nlmsg_len - NLMSG_SPACE(sizeof(struct nfgenmsg));
    struct nlattr *a = (struct nlattr *)((unsigned char *)NLMSG_DATA(h) + NLMSG_ALIGN(sizeof(struct nfgenmsg)));
    for (; len >= NLA_HDRLEN && a->nla_len >= NLA_HDRLEN && a->nla_len <= len;
         len -= NLA_ALIGN(a->nla_len), a = (struct nlattr *)((unsigned char *)a + NLA_ALIGN(a->nla_len))) {
        unsigned char *v = (unsigned char *)a + NLA_HDRLEN;
        switch (a->nla_type & NLA_TYPE_MASK) {
        case NFQA_PACKET_HDR: {
            struct nfqnl_msg_packet_hdr ph;
            memcpy(&ph, v, sizeof ph);
            id = ntohl(ph.packet_id);
            v6 = ntohs(ph.hw_protocol) == 0x86dd;
            have_id = 1;
            break;
        }
        case NFQA_PAYLOAD:
            data = v;
            dlen = a->nla_len - NLA_HDRLEN;
            break;
        case NFQA_CAP_LEN:
            caplen = ntohl(*(uint32_t *)v);
            break;
        }
    }
    if (have_id)
        on_packet(id, cfg.copy ? data : NULL, dlen, caplen ? caplen : dlen, v6, now);
}

static void receive(void) {
    static unsigned char *bufs;
    static struct mmsghdr msgs[RX_BATCH];
    static struct iovec iov[RX_BATCH];
    if (!bufs) {
        bufs = malloc((size_t)RX_BATCH * RX_SIZE);
        for (int i = 0; i < RX_BATCH; i++) {
            iov[i] = (struct iovec){bufs + (size_t)i * RX_SIZE, RX_SIZE};
            msgs[i].msg_hdr = (struct msghdr){.msg_iov = &iov[i], .msg_iovlen = 1};
        }
    }
    for (int round = 0; round < 8; round++) {
        int n = recvmmsg(nl, msgs, RX_BATCH, MSG_DONTWAIT, NULL);
        if (n <= 0)
            return;
        int64_t now = mono();
        for (int i = 0; i < n; i++) {
            int left = (int)msgs[i].msg_len; /* signed: NLMSG_NEXT of an unpadded last message goes below 0 */
            for (struct nlmsghdr *h = iov[i].iov_base; NLMSG_OK(h, left); h = NLMSG_NEXT(h, left))
                on_message(h, now);
        }
        release_due(mono());
        if (n < RX_BATCH)
            return;
    }
}

/* ---------------------------------------------------------------- counters */

static int64_t late_percentile(double q) {
    uint64_t total = 0, acc = 0;
    for (int i = 0; i <= LATE_BUCKETS; i++)
        total += late_hist[i];
    if (!total)
        return 0;
    for (int i = 0; i <= LATE_BUCKETS; i++) {
        acc += late_hist[i];
        if ((double)acc >= q * (double)total)
            return i;
    }
    return LATE_BUCKETS;
}

static void write_stats(void) {
    if (!cfg.stats)
        return;
    char tmp[4096], body[1024];
    snprintf(tmp, sizeof tmp, "%s.tmp", cfg.stats);
    int n = snprintf(body, sizeof body,
                     "{\"queue\": %d, \"seen\": %llu, \"passed\": %llu, \"delayed\": %llu, \"dropped\": %llu, "
                     "\"duplicated\": %llu, \"corrupted\": %llu, \"reordered\": %llu, \"overflow\": %llu, "
                     "\"held\": %zu, "
                     "\"max_held\": %llu, \"late_p50_us\": %lld, \"late_p99_us\": %lld, \"late_max_us\": %lld, "
                     "\"netlink_errors\": %llu, \"copy_errors\": %llu, \"sched\": \"%s\"}\n",
                     qnum, (unsigned long long)st.seen, (unsigned long long)st.passed, (unsigned long long)st.delayed,
                     (unsigned long long)st.dropped, (unsigned long long)st.duplicated,
                     (unsigned long long)st.corrupted, (unsigned long long)st.reordered,
                     (unsigned long long)st.overflow, held,
                     (unsigned long long)st.max_held, (long long)late_percentile(0.5),
                     (long long)late_percentile(0.99), (long long)(st.max_late / 1000),
                     (unsigned long long)st.nl_errors, (unsigned long long)st.copy_errors,
                     realtime ? "fifo" : "other");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    ssize_t w = write(fd, body, (size_t)n);
    close(fd);
    if (w == n)
        rename(tmp, cfg.stats);
}

/* ---------------------------------------------------------------- set-up */

static double prob(const char *v) { return strtod(v, NULL); }
static uint64_t p32(const char *v) { return (uint64_t)(prob(v) * 4294967296.0 + 0.5); }
static uint32_t rho(const char *v) { return (uint32_t)(prob(v) * 4294967295.0 + 0.5); }

static int parse_arg(const char *arg) {
    const char *eq = strchr(arg, '=');
    if (!eq)
        return -1;
    size_t k = (size_t)(eq - arg);
    const char *v = eq + 1;
#define KEY(s) (k == sizeof(s) - 1 && !strncmp(arg, s, k))
    if (KEY("delay_ns")) cfg.delay = strtoll(v, NULL, 10);
    else if (KEY("jitter_ns")) cfg.jitter = strtoll(v, NULL, 10);
    else if (KEY("delay_corr")) cfg.delay_corr = rho(v);
    else if (KEY("loss")) cfg.loss = p32(v);
    else if (KEY("loss_corr")) cfg.loss_corr = rho(v);
    else if (KEY("duplicate")) cfg.dup = p32(v);
    else if (KEY("duplicate_corr")) cfg.dup_corr = rho(v);
    else if (KEY("corrupt")) cfg.corrupt = p32(v);
    else if (KEY("corrupt_corr")) cfg.corrupt_corr = rho(v);
    else if (KEY("reorder")) cfg.reorder = p32(v);
    else if (KEY("reorder_corr")) cfg.reorder_corr = rho(v);
    else if (KEY("gap")) cfg.gap = (uint32_t)strtoul(v, NULL, 10);
    else if (KEY("rate")) cfg.rate = strtoull(v, NULL, 10);
    else if (KEY("limit")) cfg.limit = (uint32_t)strtoul(v, NULL, 10);
    else if (KEY("detach")) cfg.detach = (uint32_t)atoi(v);
    else if (KEY("mark")) cfg.mark = (uint32_t)strtoul(v, NULL, 0);
    else if (KEY("queue")) cfg.queue = atoi(v);
    else if (KEY("dist")) cfg.dist = v;
    else if (KEY("stats")) cfg.stats = v;
    else if (KEY("dev")) cfg.dev = v;
    else if (KEY("until")) cfg.until = strtod(v, NULL);
    else if (KEY("rt")) cfg.rt = atoi(v);
    else if (KEY("lead_ns")) cfg.lead = strtoll(v, NULL, 10);
    else return -1;
#undef KEY
    return 0;
}

static int load_table(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t cap = 4096;
    table = malloc(cap * sizeof *table);
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#')
            continue;
        for (char *p = line, *end;; p = end) {
            long x = strtol(p, &end, 10);
            if (end == p)
                break;
            if (table_len == cap)
                table = realloc(table, (cap *= 2) * sizeof *table);
            table[table_len++] = (int16_t)x;
        }
    }
    fclose(f);
    return table_len ? 0 : -1;
}

static const char *ns_path;
static struct stat ns_stat;

static int enter_netns(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &ns_stat) < 0 || setns(fd, CLONE_NEWNET) < 0) {
        fprintf(stderr, "netemq: entering %s: %s\n", path, strerror(errno));
        return -1;
    }
    close(fd);
    ns_path = path;
    return 0;
}

/* the namespace is still the one at its path (deleted, or its process gone: the fault's target is gone, and
 * only this program's socket still holds the namespace) */
static int ns_still_there(void) {
    struct stat now;
    return stat(ns_path, &now) == 0 && now.st_ino == ns_stat.st_ino && now.st_dev == ns_stat.st_dev;
}

static int open_netlink(void) {
    nl = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
    struct sockaddr_nl sa = {.nl_family = AF_NETLINK};
    int big = 16 << 20, one = 1;
    if (nl < 0 || bind(nl, (struct sockaddr *)&sa, sizeof sa) < 0) {
        fprintf(stderr, "netemq: netlink: %s\n", strerror(errno));
        return -1;
    }
    if (setsockopt(nl, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big) < 0)
        setsockopt(nl, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    setsockopt(nl, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big);
    setsockopt(nl, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
    return 0;
}

static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
}

/* the generator's state from $CHAOSKIT_NETEM_SEED (splitmix64 of it) or from getrandom(2); -1 on failure */
static int seed_rng(const char *seed) {
    if (!seed || !*seed)
        return getrandom(rng, sizeof rng, 0) == sizeof rng ? 0 : -1;
    uint64_t x = strtoull(seed, NULL, 0);
    for (int i = 0; i < 4; i++) {
        uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        rng[i] = z ^ (z >> 31);
    }
    return 0;
}

static int setup(int argc, char **argv) {
    for (int i = 3; i < argc; i++)
        if (parse_arg(argv[i])) {
            fprintf(stderr, "netemq: bad argument %s\n", argv[i]);
            return -1;
        }
    cfg.copy = cfg.dup || cfg.corrupt || cfg.detach;
    c_delay.rho = cfg.delay_corr, c_loss.rho = cfg.loss_corr, c_dup.rho = cfg.dup_corr;
    c_corrupt.rho = cfg.corrupt_corr, c_reorder.rho = cfg.reorder_corr;
    if (cfg.dist && load_table(cfg.dist)) {
        fprintf(stderr, "netemq: cannot read the distribution table %s\n", cfg.dist);
        return -1;
    }
    if (seed_rng(getenv("CHAOSKIT_NETEM_SEED")))
        return -1;
    txbuf = malloc(TX_SIZE);
    prctl(PR_SET_TIMERSLACK, 1UL);
    struct sched_param sp = {.sched_priority = cfg.rt};
    realtime = cfg.rt > 0 && !sched_setscheduler(0, SCHED_FIFO | SCHED_RESET_ON_FORK, &sp);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (enter_netns(argv[2]) || open_netlink() || (qnum = bind_queue()) < 0 || setup_queue())
        return -1;
    if (cfg.dup || cfg.detach) {
        raw4 = raw_socket(AF_INET);
        raw6 = raw_socket(AF_INET6); /* none where the namespace has no IPv6: nor has it IPv6 packets */
        if (raw4 < 0) {
            fprintf(stderr, "netemq: raw socket for copies: %s\n", strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- the loop */

static void serve(void) {
    int64_t next_stats = 0;
    struct pollfd pfd = {.fd = nl, .events = POLLIN};
    for (;;) {
        int64_t now = mono();
        release_due(now);
        if (stopping || (cfg.until && wall() >= cfg.until))
            break;
        if (now >= next_stats) {
            write_stats();
            next_stats = now + NS / 2;
            if (!ns_still_there())
                break;
        }
        int64_t wait = (held ? heap[0].due : now + NS / 10) - now - cfg.lead;
        if (wait > NS / 10)
            wait = NS / 10;
        if (wait <= 0) { /* the next release is within `lead`: poll the socket until it is due */
            receive();
            continue;
        }
        struct timespec ts = {wait / NS, wait % NS};
        if (ppoll(&pfd, 1, &ts, NULL) > 0)
            receive();
    }
    int64_t now = mono();
    while (held) { /* the fault is over: what is held goes now (the kernel would drop it when we close) */
        item it = heap_pop();
        release(&it, now);
    }
    flush_all();
    write_stats();
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: netemq TOKEN NS_PATH key=value...\n");
        return 2;
    }
    if (setup(argc, argv))
        return 1;
    printf("ready %d\n", qnum);
    fflush(stdout);
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    dup2(devnull, 1); /* chaoskit stops reading after `ready`: nothing may block on a full pipe */
    dup2(devnull, 2);
    serve();
    return 0;
}
