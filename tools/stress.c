/*
 * stress — the exactly-once stress run of libfetchq (make stress, and a short
 * version in make test: make test-stress-short).
 *
 *   stress [--ops N] [--seed S] [--net-permille P] [--window W]
 *          [--warmup N] [--slack-mb M] [--heap-slack-kb K] [--repo DIR]
 *          [--config JSON]
 *
 * Runs N operations (default 1 000 000) on one engine: block and async
 * operations (async ones finished in their start function or later from
 * other threads), and a minority (--net-permille, default 70 = 7%) of
 * requests and searches against the shared test server (Tests/support),
 * which it starts itself: distinct URLs and bursts of identical ones
 * (coalescing), /status/500 failures, /delay timed out by "timeout_ms",
 * /stall cancelled, /flaky retried once, searches and failing searches. On
 * top: random priorities and QoS, "depends_on" recent operations,
 * fq_add_dependency, groups cancelled with fq_cancel_group, fq_cancel from
 * another thread and from callbacks, fq_queue_cancel_all, queue
 * suspend/resume, body failures (fq_op_set_error, fq_op_finish with an
 * error), "max_wait_ms" queue timeouts, follow-up submits from callbacks.
 * At most --window operations are outstanding at once.
 *
 * Then it checks the completion contract: every accepted operation got
 * exactly one callback with a plausible outcome (an operation whose
 * fq_cancel returned FQ_OK ended CANCELLED; a success carries the value its
 * body returned; dependencies succeeded before a dependent ran; ...), a
 * rejected submit got none; the engine's stats add up; and memory returns to
 * its level after a warm-up round.
 *
 * Memory: RSS (/proc/self/statm) is measured after a warm-up round on a
 * first engine, that engine's fq_engine_free and a new engine ("start"), and
 * after the big run, fq_engine_free and a new engine ("end"); malloc_trim(0)
 * runs before each measurement so that what glibc keeps cached in its
 * per-thread arenas does not count as growth. The check allows --slack-mb
 * (default 16 MiB) of growth: RSS still moves by several MiB with arena
 * fragmentation, so a second, sharper check compares the bytes the
 * allocator has handed out and not got back (mallinfo2: uordblks + hblkhd)
 * at the same two points, with --heap-slack-kb (default 1024 KiB) of slack:
 * without network operations it moves by a few KiB, so even a leak of
 * ~100 bytes per network operation shows in the short run. This program's
 * own per-operation bookkeeping is allocated and touched before "start".
 *
 * --config JSON is merged into the engine config (e.g. '{"workers": 8}');
 * --seed changes every random choice; the figures name the seed.
 *
 * Prints the figures and ends with "N passed, N failed" (checks); exit
 * status 0 when every check passed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <fetchq.h>

/* ------------------------------------------------------------ utilities */

static long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static uint64_t mix64(uint64_t x) { /* splitmix64 finalizer */
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* A per-thread generator for decisions that need not be reproducible. */
static uint64_t rnd(uint64_t *s) {
    *s = mix64(*s);
    return *s;
}

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    long size = 0, resident = 0;
    int n = fscanf(f, "%ld %ld", &size, &resident);
    fclose(f);
    if (n != 2) return -1;
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Bytes the allocator has handed out and not got back (all arenas, mmap'ed
 * blocks included): unlike RSS, not blurred by fragmentation or by what the
 * allocator keeps cached. */
static long heap_in_use_kib(void) {
    struct mallinfo2 mi = mallinfo2();
    return (long)((mi.uordblks + mi.hblkhd) / 1024);
}

static long status_kib(const char *key) { /* VmHWM etc. from /proc/self/status */
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtol(line + kl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* ---------------------------------------------------------------- checks */

static int g_pass, g_fail;

static bool check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool check(bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (ok)
        g_pass++;
    else
        g_fail++;
    return ok;
}

/* Up to 25 examples of problems are printed; the rest are only counted. */
static atomic_int g_examples;
static void example(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void example(const char *fmt, ...) {
    if (atomic_fetch_add(&g_examples, 1) >= 40) return;
    va_list ap;
    va_start(ap, fmt);
    printf("  problem: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

/* ------------------------------------------------------- the test server */

static struct {
    pid_t pid;
    int port;
    char base[64];
    char dir[64];
} SV;

static void server_stop(void) {
    if (SV.pid > 0) {
        kill(SV.pid, SIGTERM);
        for (int i = 0; i < 100; i++) {
            if (waitpid(SV.pid, NULL, WNOHANG) == SV.pid) {
                SV.pid = 0;
                break;
            }
            sleep_us(50000);
        }
        if (SV.pid > 0) {
            kill(SV.pid, SIGKILL);
            waitpid(SV.pid, NULL, 0);
            SV.pid = 0;
        }
    }
    if (SV.dir[0]) {
        char p[128];
        snprintf(p, sizeof p, "%s/port", SV.dir);
        unlink(p);
        rmdir(SV.dir);
        SV.dir[0] = 0;
    }
}

static bool server_start(const char *repo) {
    char script[PATH_MAX];
    snprintf(script, sizeof script, "%s/Tests/support/testserver.py", repo);
    if (access(script, R_OK) != 0) {
        fprintf(stderr, "stress: %s not found (use --repo DIR)\n", script);
        return false;
    }
    snprintf(SV.dir, sizeof SV.dir, "/tmp/fq-stress-XXXXXX");
    if (!mkdtemp(SV.dir)) {
        SV.dir[0] = 0;
        perror("mkdtemp");
        return false;
    }
    char port_file[128], parent[32];
    snprintf(port_file, sizeof port_file, "%s/port", SV.dir);
    snprintf(parent, sizeof parent, "%d", (int)getpid());
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 1);
            dup2(null, 2); /* asyncio chatter about clients that went away */
        }
        execlp("python3", "python3", "-B", script, "--port", "0", "--port-file", port_file,
               "--parent-pid", parent, "--max-seconds", "3600", (char *)NULL);
        _exit(127);
    }
    SV.pid = pid;
    for (int i = 0; i < 400; i++) { /* 20 s */
        FILE *f = fopen(port_file, "r");
        if (f) {
            int port = 0;
            bool got = fscanf(f, "%d", &port) == 1;
            fclose(f);
            if (got && port > 0) {
                SV.port = port;
                snprintf(SV.base, sizeof SV.base, "http://127.0.0.1:%d", port);
                return true;
            }
        }
        if (waitpid(SV.pid, NULL, WNOHANG) == SV.pid) {
            SV.pid = 0;
            break;
        }
        sleep_us(50000);
    }
    fprintf(stderr, "stress: the test server did not start\n");
    server_stop();
    return false;
}

/* A plain HTTP/1.1 GET on its own socket, independent of the library.
 * Returns the parsed JSON body of a 200 (NEW reference) or NULL. */
static json_t *http_get_json(const char *target) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return NULL;
    struct timeval tv = {30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)SV.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return NULL;
    }
    char req[512];
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n", target,
                     SV.port);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r <= 0) break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = 0;
    json_t *v = NULL;
    char *body = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.1 200", 12) == 0 && body)
        v = json_loads(body + 4, JSON_DECODE_ANY, NULL);
    free(buf);
    return v;
}

/* ------------------------------------------------------------ operations */

enum kind {
    K_BLOCK,            /* returns {"i": index} */
    K_BLOCK_SPIN,       /* runs ~200 us (returns early when cancelled), {"i": index} */
    K_BLOCK_FAIL,       /* fq_op_set_error */
    K_ASYNC_NOW,        /* fq_op_finish in its start function */
    K_ASYNC_LATER,      /* fq_op_finish from a finisher thread */
    K_ASYNC_LATER_FAIL, /* fq_op_finish(op, NULL, "message") from a finisher thread */
    K_CB_BLOCK,         /* a block submitted from a completion callback */
    K_GET_JSON,         /* GET /json?size=..&k=index: distinct URLs */
    K_GET_SHARED,       /* GET /echo?s=J: bursts of identical URLs (coalescing) */
    K_GET_500,          /* GET /status/500: FQ_ERR_HTTP */
    K_GET_TIMEOUT,      /* GET /delay?ms=2000 with "timeout_ms": 20: FQ_ERR_TIMEOUT */
    K_GET_STALL,        /* GET /stall, cancelled by the canceller thread */
    K_GET_FLAKY,        /* GET /flaky (fails once), "retry": {"max": 1, "base": 0.001} */
    K_SEARCH,           /* fq_submit_search(tag) */
    K_SEARCH_FAIL,      /* fq_submit_search("__fail"): 500, FQ_ERR_HTTP */
    K_COUNT
};
static const char *kind_names[K_COUNT] = {
    "block", "block-spin", "block-fail", "async-now", "async-later", "async-later-fail",
    "cb-block", "get-json", "get-shared", "get-500", "get-timeout", "get-stall", "get-flaky",
    "search", "search-fail"};
static bool is_net(int k) { return k >= K_GET_JSON; }

enum { NQ = 4, NGROUPS = 6, RING = 512, MAXDEPS = 3, STALL_BACKSTOP_MS = 20000 };
static const char *q_names[NQ] = {"serial", "q3", "q8", "wide"};
static const int q_limits[NQ] = {1, 3, 8, 32};
static const char *tags[] = {"swift", "c", "python", "rust", "go", "json", "http", "queue"};
enum { NTAGS = sizeof tags / sizeof tags[0] };

typedef struct {
    atomic_llong id;          /* > 0 accepted; < 0 the submit's status; 0 not submitted */
    atomic_llong submit_seq;  /* g_seq when its submit began */
    atomic_llong start_seq;   /* g_seq when its body started */
    atomic_llong end_seq;     /* g_seq when its body returned / before fq_op_finish */
    atomic_llong body_id;     /* fq_op_get_id() in the body */
    atomic_int calls;
    atomic_int body_runs;
    atomic_int body_bad;      /* the body saw a dependency that had not succeeded */
    atomic_int cancel_tried;  /* fq_cancel was called on it (set before the call) */
    atomic_int cancel_ok;     /* ... and returned FQ_OK */
    atomic_int added_dep;     /* slot index + 1 of a dependency added by fq_add_dependency */
    int32_t dep[MAXDEPS];
    uint8_t ndeps, kind, queue, group /* 0 = none */, maxwait;
    int32_t param;
    /* written by the callback (read after fq_engine_wait_idle) */
    int8_t outcome;
    int16_t status;
    int16_t http;
    bool value_ok, msg_ok;
    int64_t result_id;
    int64_t named_dep; /* FQ_ERR_DEPENDENCY: the id its message names */
} slot;

static struct {
    fq_engine *e;
    fq_queue *q[NQ];
    slot *s;           /* every slot of every round */
    long base, end;    /* this round's slots: [base, end) */
    atomic_long next;  /* the next slot to submit */
    atomic_long accepted, completed, rejected_nf;
    int window;
    int round;
    int net_permille;
    uint64_t seed;
    atomic_llong seq;
    atomic_int stop_submit, stop_helpers, stop_finishers;
    /* recent accepted slots (for depends_on, add_dependency, cancels) */
    atomic_long ring[RING];
    atomic_long ring_pos;
    /* cancels by group / queue: g_seq when the last such call returned */
    atomic_llong group_cancel_seq[NGROUPS + 1];
    atomic_llong queue_cancel_seq[NQ];
    /* counters */
    atomic_long thread_cancels_ok, cb_cancels_ok, group_cancelled, queue_cancelled,
        stall_cancels_ok, adddep_ok, setprio_ok, cb_submits, api_bad, suspends;
    atomic_int in_callback, max_in_callback;
    atomic_int running[NQ], max_running[NQ];
    /* async operations waiting for a finisher */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fq_op **pend_op;
    long *pend_slot;
    int npend, cap_pend;
    /* stall operations waiting to be cancelled */
    pthread_mutex_t stall_mu;
    long stall[4096];
    long long stall_at[4096];
    int nstall;
    /* snapshot consistency observed by the sampler (information) */
    atomic_long snapshots, snapshot_mismatch, snapshot_mismatch2;
    long snap_dmin, snap_dmax; /* sampler thread only */
    atomic_long rss_peak;
    int expected_count[NTAGS];
} G;

static long long next_seq(void) { return atomic_fetch_add(&G.seq, 1) + 1; }

static void bump_max(atomic_int *m, int v) {
    int cur = atomic_load(m);
    while (v > cur && !atomic_compare_exchange_weak(m, &cur, v)) {
    }
}

static void api_bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void api_bad(const char *fmt, ...) {
    atomic_fetch_add(&G.api_bad, 1);
    if (atomic_fetch_add(&g_examples, 1) >= 40) return;
    va_list ap;
    va_start(ap, fmt);
    printf("  problem: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

static long ring_pick(uint64_t r) {
    long pos = atomic_load(&G.ring_pos);
    if (pos == 0) return -1;
    long n = pos < RING ? pos : RING;
    long idx = atomic_load(&G.ring[(r % (uint64_t)n)]);
    return idx >= G.base ? idx : -1;
}

static void ring_push(long idx) {
    long p = atomic_fetch_add(&G.ring_pos, 1);
    atomic_store(&G.ring[p % RING], idx);
}

static long slot_index(const slot *s) { return (long)(s - G.s); }

/* ---------------------------------------------------------------- bodies */

static void body_begin(fq_op *op, slot *s) {
    atomic_fetch_add(&s->body_runs, 1);
    atomic_store(&s->start_seq, next_seq());
    atomic_store(&s->body_id, fq_op_get_id(op));
    bump_max(&G.max_running[s->queue], atomic_fetch_add(&G.running[s->queue], 1) + 1);
    for (int k = 0; k < s->ndeps; k++) {
        const slot *d = &G.s[s->dep[k]];
        fq_op_id did = (fq_op_id)atomic_load(&d->id);
        const fq_result *r = fq_op_dependency(op, did);
        bool ok = r && fq_result_outcome(r) == FQ_SUCCEEDED && fq_result_op_id(r) == did;
        if (ok && !is_net(d->kind)) {
            json_t *v = fq_op_dependency_result(op, did);
            json_t *i = json_object_get(v, "i");
            ok = json_is_integer(i) && json_integer_value(i) == slot_index(d);
        }
        if (!ok) atomic_fetch_add(&s->body_bad, 1);
    }
}

static void body_end(slot *s) {
    atomic_fetch_sub(&G.running[s->queue], 1);
    atomic_store(&s->end_seq, next_seq());
}

static json_t *value_for(slot *s) { return json_pack("{s:I}", "i", (json_int_t)slot_index(s)); }

static json_t *stress_block(fq_op *op, void *userdata) {
    slot *s = userdata;
    body_begin(op, s);
    json_t *v = NULL;
    if (s->kind == K_BLOCK_FAIL) {
        char msg[64];
        snprintf(msg, sizeof msg, "planned failure %ld", slot_index(s));
        if (fq_op_set_error(op, msg) != FQ_OK) api_bad("fq_op_set_error in a block body failed");
        if (s->param & 1) v = value_for(s); /* discarded by the library */
    } else {
        if (s->kind == K_BLOCK_SPIN) {
            long long until = now_us() + 200;
            while (now_us() < until && !fq_op_is_cancelled(op)) {
            }
        }
        v = value_for(s);
    }
    body_end(s);
    return v;
}

static void stress_async(fq_op *op, void *userdata) {
    slot *s = userdata;
    body_begin(op, s);
    if (s->kind == K_ASYNC_NOW) {
        body_end(s);
        int rc = fq_op_finish(op, value_for(s), NULL);
        if (rc != FQ_OK) api_bad("fq_op_finish in the start function: %d", rc);
        return;
    }
    pthread_mutex_lock(&G.mu);
    if (G.npend == G.cap_pend) {
        G.cap_pend = G.cap_pend ? G.cap_pend * 2 : 1024;
        G.pend_op = realloc(G.pend_op, (size_t)G.cap_pend * sizeof *G.pend_op);
        G.pend_slot = realloc(G.pend_slot, (size_t)G.cap_pend * sizeof *G.pend_slot);
    }
    G.pend_op[G.npend] = op;
    G.pend_slot[G.npend] = slot_index(s);
    G.npend++;
    pthread_cond_signal(&G.cv);
    pthread_mutex_unlock(&G.mu);
}

static void *finisher_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&G.mu);
    for (;;) {
        while (G.npend == 0 && !atomic_load(&G.stop_finishers)) pthread_cond_wait(&G.cv, &G.mu);
        if (G.npend == 0) break;
        /* take the oldest half of the time, the newest otherwise */
        int at = (G.npend & 1) ? 0 : G.npend - 1;
        fq_op *op = G.pend_op[at];
        slot *s = &G.s[G.pend_slot[at]];
        G.pend_op[at] = G.pend_op[G.npend - 1];
        G.pend_slot[at] = G.pend_slot[G.npend - 1];
        G.npend--;
        pthread_mutex_unlock(&G.mu);
        body_end(s);
        int rc = s->kind == K_ASYNC_LATER_FAIL ? fq_op_finish(op, NULL, "planned async failure")
                                                : fq_op_finish(op, value_for(s), NULL);
        if (rc != FQ_OK) api_bad("fq_op_finish from a finisher thread: %d", rc);
        pthread_mutex_lock(&G.mu);
    }
    pthread_mutex_unlock(&G.mu);
    return NULL;
}

/* -------------------------------------------------------------- submitting */

static const char *prio_names[] = {"very-low", "low", "normal", "high", "very-high"};
static const int prio_values[] = {-8, -4, 0, 4, 8};
static const char *qos_names[] = {"user-interactive", "user-initiated", "default", "utility",
                                  "background"};

static void try_cancel(long idx, atomic_long *counter) {
    if (idx < G.base || idx >= G.end) return;
    slot *t = &G.s[idx];
    fq_op_id id = (fq_op_id)atomic_load(&t->id);
    if (id <= 0) return;
    atomic_store(&t->cancel_tried, 1);
    int rc = fq_cancel(G.e, id);
    if (rc == FQ_OK) {
        atomic_store(&t->cancel_ok, 1);
        if (counter) atomic_fetch_add(counter, 1);
    } else if (rc != FQ_ERR_NOT_FOUND) {
        api_bad("fq_cancel(%lld) = %d (%s)", (long long)id, rc, fq_strerror(rc));
    }
}

static void completion(const fq_result *res, void *userdata);

/* Chooses what slot `idx` does (deterministic in seed and index). */
static void plan(slot *s, long idx) {
    uint64_t h = mix64(G.seed ^ (uint64_t)idx * 0x9E3779B97F4A7C15ULL);
    uint64_t hb = mix64(G.seed ^ (uint64_t)(idx >> 2) * 0xD6E8FEB86659FD93ULL); /* per 4 */
    int permille = (int)(h % 1000);
    s->param = (int32_t)((h >> 10) & 0x7fffffff);
    int k;
    if ((int)(hb % 1000) < G.net_permille / 8) {
        k = K_GET_SHARED; /* a burst of 4 identical GETs */
        s->param = (int32_t)((hb >> 12) % 64);
    } else if (permille < G.net_permille - G.net_permille / 8) {
        int n = (int)((h >> 20) % 100);
        k = n < 38 ? K_GET_JSON : n < 58 ? K_SEARCH : n < 70 ? K_GET_500 : n < 82 ? K_GET_FLAKY
            : n < 87 ? K_SEARCH_FAIL : n < 94 ? K_GET_TIMEOUT : K_GET_STALL;
    } else {
        int n = (int)((h >> 20) % 100);
        k = n < 38 ? K_BLOCK : n < 46 ? K_BLOCK_SPIN : n < 50 ? K_BLOCK_FAIL : n < 72 ? K_ASYNC_NOW
            : n < 95 ? K_ASYNC_LATER : K_ASYNC_LATER_FAIL;
    }
    s->kind = (uint8_t)k;
    s->queue = (uint8_t)(is_net(k) ? 2 + (h >> 30) % 2 : (h >> 30) % NQ);
    s->group = (h >> 33) % 5 == 0 ? (uint8_t)(1 + (h >> 36) % NGROUPS) : 0;
    s->maxwait = (h >> 40) % 100 < 3 ? (uint8_t)(1 + (h >> 44) % 3) : 0;
    s->ndeps = 0;
    int depp = is_net(k) ? 5 : 25;
    if (k != K_GET_SHARED && (int)((h >> 48) % 100) < depp) {
        int want = 1 + (int)((h >> 55) % 2);
        uint64_t r = mix64(h);
        for (int d = 0; d < want; d++) {
            long pick = ring_pick(r >> (d * 16));
            if (pick < 0 || pick == idx || atomic_load(&G.s[pick].id) <= 0) continue;
            if (d == 1 && s->ndeps == 1 && s->dep[0] == pick) continue;
            s->dep[s->ndeps++] = (int32_t)pick;
        }
    }
}

/* Options of slot s (NEW reference). */
static json_t *options_for(slot *s, long idx) {
    uint64_t h = mix64((uint64_t)idx ^ 0xA5A5A5A5ULL ^ G.seed);
    json_t *o = json_object();
    if (h % 2)
        json_object_set_new(o, "priority", json_string(prio_names[(h >> 1) % 5]));
    else
        json_object_set_new(o, "priority", json_integer(prio_values[(h >> 1) % 5]));
    if ((h >> 4) % 3 == 0) json_object_set_new(o, "qos", json_string(qos_names[(h >> 6) % 5]));
    if (s->group) {
        char g[8];
        snprintf(g, sizeof g, "g%d", s->group);
        json_object_set_new(o, "group", json_string(g));
    }
    if (s->ndeps) {
        json_t *a = json_array();
        for (int d = 0; d < s->ndeps; d++)
            json_array_append_new(a, json_integer(atomic_load(&G.s[s->dep[d]].id)));
        json_object_set_new(o, "depends_on", a);
    }
    if (s->maxwait) json_object_set_new(o, "max_wait_ms", json_integer(s->maxwait));
    switch (s->kind) {
    case K_GET_TIMEOUT:
        json_object_set_new(o, "timeout_ms", json_integer(20));
        break;
    case K_GET_STALL:
        json_object_set_new(o, "timeout_ms", json_integer(STALL_BACKSTOP_MS));
        break;
    case K_GET_FLAKY:
        json_object_set_new(o, "retry", json_pack("{s:i,s:f}", "max", 1, "base", 0.001));
        break;
    default:
        break;
    }
    return o;
}

static fq_op_id submit_slot(long idx) {
    slot *s = &G.s[idx];
    json_t *o = options_for(s, idx);
    fq_queue *q = G.q[s->queue];
    atomic_store(&s->submit_seq, next_seq());
    fq_op_id id;
    char url[256];
    switch (s->kind) {
    case K_BLOCK:
    case K_BLOCK_SPIN:
    case K_BLOCK_FAIL:
    case K_CB_BLOCK:
        id = fq_submit_block(q, stress_block, o, completion, s);
        break;
    case K_ASYNC_NOW:
    case K_ASYNC_LATER:
    case K_ASYNC_LATER_FAIL:
        id = fq_submit_async(q, stress_async, o, completion, s);
        break;
    case K_SEARCH:
        id = fq_submit_search(q, tags[s->param % NTAGS], o, completion, s);
        break;
    case K_SEARCH_FAIL:
        id = fq_submit_search(q, "__fail", o, completion, s);
        break;
    default: {
        switch (s->kind) {
        case K_GET_JSON:
            snprintf(url, sizeof url, "%s/json?size=%d&k=%d-%ld", SV.base, 50 + s->param % 400,
                     G.round, idx);
            break;
        case K_GET_SHARED:
            snprintf(url, sizeof url, "%s/echo?s=%d", SV.base, s->param);
            break;
        case K_GET_500:
            snprintf(url, sizeof url, "%s/status/500", SV.base);
            break;
        case K_GET_TIMEOUT:
            snprintf(url, sizeof url, "%s/delay?ms=2000&k=%d-%ld", SV.base, G.round, idx);
            break;
        case K_GET_STALL:
            snprintf(url, sizeof url, "%s/stall?k=%d-%ld", SV.base, G.round, idx);
            break;
        default: /* K_GET_FLAKY */
            snprintf(url, sizeof url, "%s/flaky?key=r%d-%ld&fail=1", SV.base, G.round, idx);
            break;
        }
        json_t *req = json_pack("{s:s}", "url", url);
        id = fq_submit_request(q, req, o, completion, s);
        json_decref(req);
    }
    }
    json_decref(o);
    if (id > 0) {
        atomic_store(&s->id, id);
        atomic_fetch_add(&G.accepted, 1);
        if (s->kind == K_GET_STALL) {
            pthread_mutex_lock(&G.stall_mu);
            if (G.nstall < (int)(sizeof G.stall / sizeof *G.stall)) {
                G.stall[G.nstall] = idx;
                G.stall_at[G.nstall] = now_us();
                G.nstall++;
            }
            pthread_mutex_unlock(&G.stall_mu);
        }
    } else {
        atomic_store(&s->id, id);
        if (id == FQ_ERR_NOT_FOUND && s->ndeps > 0)
            atomic_fetch_add(&G.rejected_nf, 1); /* a dependency left the history */
        else
            api_bad("submit of slot %ld (%s) failed: %lld (%s)", idx, kind_names[s->kind],
                    (long long)id, fq_last_error());
    }
    return id;
}

/* ------------------------------------------------------------ completion */

static bool value_plausible(const slot *s, const fq_result *res) {
    json_t *v = fq_result_value(res);
    long idx = slot_index(s);
    switch (s->kind) {
    case K_BLOCK:
    case K_BLOCK_SPIN:
    case K_ASYNC_NOW:
    case K_ASYNC_LATER:
    case K_CB_BLOCK: {
        json_t *i = json_object_get(v, "i");
        return json_is_integer(i) && json_integer_value(i) == idx;
    }
    case K_GET_JSON:
        return fq_result_http_status(res) == 200 && json_is_array(json_object_get(v, "items"));
    case K_GET_SHARED: {
        json_t *sv = json_object_get(json_object_get(v, "query"), "s");
        char want[16];
        snprintf(want, sizeof want, "%d", s->param);
        return fq_result_http_status(res) == 200 && json_is_string(sv) &&
               strcmp(json_string_value(sv), want) == 0;
    }
    case K_GET_FLAKY: {
        json_t *m = fq_result_metrics(res);
        return fq_result_http_status(res) == 200 &&
               json_integer_value(json_object_get(v, "attempt")) == 2 &&
               json_integer_value(json_object_get(m, "attempts")) == 2;
    }
    case K_SEARCH: {
        const char *tag = tags[s->param % NTAGS];
        json_t *items = json_object_get(v, "items");
        json_t *q = json_object_get(v, "query");
        json_int_t count = json_integer_value(json_object_get(v, "count"));
        return json_is_array(items) && (json_int_t)json_array_size(items) == count &&
               count == G.expected_count[s->param % NTAGS] && json_is_string(q) &&
               strcmp(json_string_value(q), tag) == 0;
    }
    default:
        return false; /* kinds that never succeed */
    }
}

static void completion(const fq_result *res, void *userdata) {
    slot *s = userdata;
    long idx = slot_index(s);
    bump_max(&G.max_in_callback, atomic_fetch_add(&G.in_callback, 1) + 1);
    s->result_id = fq_result_op_id(res);
    /* the callback may run before the submitter stored the id */
    long long zero = 0;
    atomic_compare_exchange_strong(&s->id, &zero, (long long)s->result_id);
    s->outcome = (int8_t)fq_result_outcome(res);
    s->status = (int16_t)fq_result_status(res);
    s->http = (int16_t)fq_result_http_status(res);
    const char *msg = fq_result_error(res);
    if (s->outcome == FQ_SUCCEEDED) {
        s->value_ok = value_plausible(s, res);
        s->msg_ok = msg == NULL;
    } else {
        s->value_ok = true;
        s->msg_ok = msg != NULL && msg[0] != '\0';
        if (s->msg_ok && s->status == FQ_ERR_DEPENDENCY) {
            /* "... a message naming that id": checked against the dependencies
             * after the run (an fq_add_dependency may still be returning) */
            const char *p = msg;
            while (*p && !(*p >= '1' && *p <= '9')) p++;
            s->named_dep = strtoll(p, NULL, 10);
        }
        if (s->msg_ok && s->kind == K_BLOCK_FAIL && s->status == FQ_ERR_OPERATION) {
            char want[64];
            snprintf(want, sizeof want, "planned failure %ld", idx);
            s->msg_ok = strstr(msg, want) != NULL;
        }
    }
    if (!s->msg_ok)
        example("slot %ld (%s, id %lld): outcome %d status %d, message \"%s\"", idx,
                kind_names[s->kind], (long long)s->result_id, s->outcome, s->status,
                msg ? msg : "(null)");
    /* side effects, now and then: a cancel, a priority change, a follow-up */
    uint64_t h = mix64((uint64_t)idx * 0xC2B2AE3D27D4EB4FULL ^ G.seed);
    if (h % 120 == 0) try_cancel(idx - 1 - (long)((h >> 8) % 200), &G.cb_cancels_ok);
    if ((h >> 16) % 300 == 0) {
        long t = ring_pick(h >> 24);
        if (t >= 0) {
            int rc = fq_set_priority(G.e, (fq_op_id)atomic_load(&G.s[t].id),
                                     prio_values[(h >> 40) % 5]);
            if (rc == FQ_OK)
                atomic_fetch_add(&G.setprio_ok, 1);
            else if (rc != FQ_ERR_NOT_FOUND && rc != FQ_ERR_STATE)
                api_bad("fq_set_priority from a callback = %d", rc);
        }
    }
    if ((h >> 32) % 40 == 0 && !atomic_load(&G.stop_submit)) {
        long n = atomic_fetch_add(&G.next, 1);
        if (n < G.end) {
            slot *f = &G.s[n];
            f->kind = K_CB_BLOCK;
            f->queue = (uint8_t)((h >> 44) % NQ);
            f->ndeps = 0;
            if ((h >> 50) % 2) f->dep[f->ndeps++] = (int32_t)idx; /* a finished dependency */
            atomic_fetch_add(&G.cb_submits, 1);
            submit_slot(n);
        }
    }
    atomic_fetch_sub(&G.in_callback, 1);
    atomic_fetch_add(&s->calls, 1);
    atomic_fetch_add(&G.completed, 1);
}

/* -------------------------------------------------------------- threads */

static void *submitter_main(void *arg) {
    uint64_t r = (uint64_t)(uintptr_t)arg * 0x1234567ULL + G.seed;
    for (;;) {
        while (atomic_load(&G.accepted) - atomic_load(&G.completed) >= G.window)
            sleep_us(100);
        long idx = atomic_fetch_add(&G.next, 1);
        if (idx >= G.end) break;
        slot *s = &G.s[idx];
        plan(s, idx);
        fq_op_id id = submit_slot(idx);
        if (id <= 0) continue;
        uint64_t x = rnd(&r);
        if (x % 50 == 0) { /* an extra dependency on a recent operation */
            long d = ring_pick(x >> 8);
            if (d >= 0 && d != idx) {
                int rc = fq_add_dependency(G.e, id, (fq_op_id)atomic_load(&G.s[d].id));
                if (rc == FQ_OK) {
                    atomic_store(&s->added_dep, (int)d + 1);
                    atomic_fetch_add(&G.adddep_ok, 1);
                } else if (rc != FQ_ERR_STATE && rc != FQ_ERR_NOT_FOUND) {
                    api_bad("fq_add_dependency(%lld, %lld) = %d (%s)", (long long)id,
                            (long long)atomic_load(&G.s[d].id), rc, fq_last_error());
                }
            }
        }
        if ((x >> 16) % 100 == 0) {
            int rc = fq_set_priority(G.e, id, prio_values[(x >> 24) % 5]);
            if (rc == FQ_OK)
                atomic_fetch_add(&G.setprio_ok, 1);
            else if (rc != FQ_ERR_STATE && rc != FQ_ERR_NOT_FOUND)
                api_bad("fq_set_priority(%lld) = %d", (long long)id, rc);
        }
        /* only submitter operations go into the ring, after add_dependency:
         * nothing can depend on an operation before it is there, so no
         * dependency added above can close a cycle */
        ring_push(idx);
    }
    return NULL;
}

static void *canceller_main(void *arg) {
    (void)arg;
    uint64_t r = G.seed ^ 0xCA7CA7;
    long iter = 0;
    while (!atomic_load(&G.stop_helpers)) {
        iter++;
        uint64_t x = rnd(&r);
        long next = atomic_load(&G.next);
        if (next > G.base && x % 4 == 0) {
            long back = (long)((x >> 8) % 3000);
            long t = (next < G.end ? next : G.end) - 1 - back;
            try_cancel(t, &G.thread_cancels_ok);
        }
        /* stall operations older than 1 ms */
        long long now = now_us();
        pthread_mutex_lock(&G.stall_mu);
        for (int i = 0; i < G.nstall;) {
            if (now - G.stall_at[i] >= 1000) {
                long idx = G.stall[i];
                G.stall[i] = G.stall[G.nstall - 1];
                G.stall_at[i] = G.stall_at[G.nstall - 1];
                G.nstall--;
                pthread_mutex_unlock(&G.stall_mu);
                try_cancel(idx, &G.stall_cancels_ok);
                pthread_mutex_lock(&G.stall_mu);
            } else {
                i++;
            }
        }
        pthread_mutex_unlock(&G.stall_mu);
        if (iter % 3000 == 0) {
            int g = 1 + (int)((x >> 20) % NGROUPS);
            char name[8];
            snprintf(name, sizeof name, "g%d", g);
            int n = fq_cancel_group(G.e, name);
            if (n < 0) api_bad("fq_cancel_group(%s) = %d", name, n);
            else atomic_fetch_add(&G.group_cancelled, n);
            atomic_store(&G.group_cancel_seq[g], next_seq());
        }
        if (iter % 20000 == 0) {
            int qi = 1; /* "q3" */
            int n = fq_queue_cancel_all(G.q[qi]);
            if (n < 0) api_bad("fq_queue_cancel_all = %d", n);
            else atomic_fetch_add(&G.queue_cancelled, n);
            atomic_store(&G.queue_cancel_seq[qi], next_seq());
        }
        sleep_us(40);
    }
    return NULL;
}

static atomic_int g_suspender_stop;
static void *suspender_main(void *arg) {
    (void)arg;
    uint64_t r = G.seed ^ 0x5C5C;
    while (!atomic_load(&g_suspender_stop)) {
        uint64_t x = rnd(&r);
        int qi = (int)(x % NQ);
        if (fq_queue_set_suspended(G.q[qi], true) != FQ_OK) api_bad("suspend failed");
        atomic_fetch_add(&G.suspends, 1);
        sleep_us(300 + (long)((x >> 8) % 2000));
        if (fq_queue_set_suspended(G.q[qi], false) != FQ_OK) api_bad("resume failed");
        sleep_us(3000 + (long)((x >> 20) % 10000));
    }
    for (int i = 0; i < NQ; i++) fq_queue_set_suspended(G.q[i], false);
    return NULL;
}

static atomic_int g_sampler_stop;
static pthread_mutex_t g_engine_mu = PTHREAD_MUTEX_INITIALIZER; /* G.e for the sampler */

static void set_engine(fq_engine *e) {
    pthread_mutex_lock(&g_engine_mu);
    G.e = e;
    pthread_mutex_unlock(&g_engine_mu);
}

static void *sampler_main(void *arg) {
    (void)arg;
    while (!atomic_load(&g_sampler_stop)) {
        long r = rss_kib();
        long p = atomic_load(&G.rss_peak);
        if (r > p) atomic_store(&G.rss_peak, r);
        pthread_mutex_lock(&g_engine_mu);
        fq_engine *e = G.e;
        if (e) {
            json_t *st = fq_engine_stats(e);
            json_int_t sub = json_integer_value(json_object_get(st, "submitted"));
            json_int_t sum = 0;
            static const char *keys[] = {"succeeded", "failed", "cancelled", "queued", "running",
                                         "undelivered"};
            for (int i = 0; i < 5; i++) sum += json_integer_value(json_object_get(st, keys[i]));
            atomic_fetch_add(&G.snapshots, 1);
            if (sum != sub) atomic_fetch_add(&G.snapshot_mismatch, 1);
            long d = (long)(sum - sub);
            if (d + json_integer_value(json_object_get(st, keys[5])) != 0)
                atomic_fetch_add(&G.snapshot_mismatch2, 1);
            if (d < G.snap_dmin) G.snap_dmin = d;
            if (d > G.snap_dmax) G.snap_dmax = d;
            json_decref(st);
        }
        pthread_mutex_unlock(&g_engine_mu);
        sleep_us(20000);
    }
    return NULL;
}

/* ----------------------------------------------------------------- rounds */

typedef struct {
    long ops;
    long long ms;
    long outcome[4];
    long by_kind[K_COUNT][4];
    long status_count[32];
} round_result;

static json_t *g_extra_config; /* --config: merged into the engine config */

static fq_engine *new_engine(void) {
    char cfg[512];
    snprintf(cfg, sizeof cfg,
             "{\"workers\": 4, \"max_per_host\": 16, \"log\": \"critical\","
             " \"search\": {\"url\": \"%s/search?q={query}&rpp=500\", \"results\": \"/results\"}}",
             SV.base);
    json_error_t jerr;
    json_t *c = json_loads(cfg, 0, &jerr);
    if (g_extra_config) json_object_update(c, g_extra_config);
    char err[256] = "";
    fq_engine *e = fq_engine_new(c, err, sizeof err);
    json_decref(c);
    if (!e) fprintf(stderr, "stress: fq_engine_new: %s\n", err);
    return e;
}

/* Runs slots [base, base + n) on engine e. Returns false if it could not end. */
static bool run_round(fq_engine *e, long base, long n, int round, round_result *rr) {
    set_engine(e);
    G.base = base;
    G.end = base + n;
    G.round = round;
    atomic_store(&G.next, base);
    atomic_store(&G.accepted, 0);
    atomic_store(&G.completed, 0);
    atomic_store(&G.rejected_nf, 0);
    atomic_store(&G.ring_pos, 0);
    atomic_store(&G.stop_submit, 0);
    atomic_store(&G.stop_helpers, 0);
    atomic_store(&G.stop_finishers, 0);
    atomic_store(&g_suspender_stop, 0);
    atomic_store(&G.in_callback, 0);
    atomic_store(&G.max_in_callback, 0);
    G.nstall = 0;
    G.npend = 0;
    for (int i = 0; i <= NGROUPS; i++) atomic_store(&G.group_cancel_seq[i], 0);
    for (int i = 0; i < NQ; i++) {
        atomic_store(&G.queue_cancel_seq[i], 0);
        atomic_store(&G.running[i], 0);
        atomic_store(&G.max_running[i], 0);
        G.q[i] = fq_queue_new(e, q_names[i], q_limits[i]);
        if (!G.q[i]) {
            fprintf(stderr, "stress: fq_queue_new: %s\n", fq_last_error());
            return false;
        }
    }
    pthread_t sub[2], fin[2], canc, susp;
    long long t0 = now_us();
    for (int i = 0; i < 2; i++) pthread_create(&fin[i], NULL, finisher_main, NULL);
    pthread_create(&canc, NULL, canceller_main, NULL);
    pthread_create(&susp, NULL, suspender_main, NULL);
    for (int i = 0; i < 2; i++) pthread_create(&sub[i], NULL, submitter_main, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < 2; i++) pthread_join(sub[i], NULL);
    atomic_store(&G.stop_submit, 1); /* no more follow-ups from callbacks */
    atomic_store(&g_suspender_stop, 1);
    pthread_join(susp, NULL);
    /* the canceller keeps cancelling stalls while we wait */
    int rc = fq_engine_wait_idle(e, 300000);
    rr->ms = (now_us() - t0) / 1000;
    atomic_store(&G.stop_helpers, 1);
    pthread_join(canc, NULL);
    pthread_mutex_lock(&G.mu);
    atomic_store(&G.stop_finishers, 1);
    pthread_cond_broadcast(&G.cv);
    pthread_mutex_unlock(&G.mu);
    if (!check(rc == FQ_OK, "round %d: fq_engine_wait_idle returned %d (%s)", round, rc,
               fq_strerror(rc))) {
        json_t *st = fq_engine_stats(e);
        char *dump = json_dumps(st, JSON_COMPACT);
        printf("  stats: %s\n  %ld pending async finishes\n", dump, (long)G.npend);
        free(dump);
        json_decref(st);
        return false;
    }
    for (int i = 0; i < 2; i++) pthread_join(fin[i], NULL);
    long used = atomic_load(&G.next);
    if (used > G.end) used = G.end;
    rr->ops = used - base;
    return true;
}

static bool deps_succeeded(const slot *s) {
    for (int d = 0; d < s->ndeps; d++)
        if (G.s[s->dep[d]].outcome != FQ_SUCCEEDED) return false;
    int ad = atomic_load((atomic_int *)&s->added_dep);
    if (ad && G.s[ad - 1].outcome != FQ_SUCCEEDED) return false;
    return true;
}

/* The per-operation checks of a round, and the engine's stats. */
static void check_round(fq_engine *e, long base, int round, round_result *rr, bool quiet) {
    long end = base + rr->ops;
    long accepted = 0, rejected = 0, missing = 0, extra = 0, spurious = 0, wrong_id = 0,
         implausible = 0, cancel_ok_not_cancelled = 0, dep_order = 0, body_twice = 0,
         bad_value = 0, bad_msg = 0, stall_timeouts = 0;
    long qsub[NQ] = {0}, qout[NQ][4];
    memset(qout, 0, sizeof qout);
#define BAD(counter, ...)              \
    do {                               \
        counter++;                     \
        example(__VA_ARGS__);          \
    } while (0)
    for (long i = base; i < end; i++) {
        slot *s = &G.s[i];
        long long id = atomic_load(&s->id);
        int calls = atomic_load(&s->calls), runs = atomic_load(&s->body_runs);
        const char *kn = kind_names[s->kind];
        if (id <= 0) {
            rejected++;
            if (calls || runs)
                BAD(spurious, "slot %ld (%s): submit returned %lld but %d callbacks, %d body runs",
                    i, kn, id, calls, runs);
            continue;
        }
        accepted++;
        if (calls == 0) {
            BAD(missing, "slot %ld (%s, id %lld): no callback", i, kn, id);
            continue;
        }
        if (calls > 1) BAD(extra, "slot %ld (%s, id %lld): %d callbacks", i, kn, id, calls);
        if (s->result_id != id || (runs && atomic_load(&s->body_id) != id))
            BAD(wrong_id, "slot %ld: submitted as %lld, callback for %lld, body saw %lld", i, id,
                (long long)s->result_id, (long long)atomic_load(&s->body_id));
        if (runs > 1) BAD(body_twice, "slot %ld (%s): body ran %d times", i, kn, runs);
        int oc = s->outcome;
        if (oc >= 1 && oc <= 3) {
            rr->outcome[oc]++;
            rr->by_kind[s->kind][oc]++;
            qout[s->queue][oc]++;
        } else {
            rr->outcome[0]++;
        }
        qsub[s->queue]++;
        int st = s->status;
        if (st <= 0 && st > -32) rr->status_count[-st]++;
        bool deps_ok = deps_succeeded(s);
        bool cancel_ok = atomic_load(&s->cancel_ok);
        long long sseq = atomic_load(&s->submit_seq);
        bool cancel_seen = atomic_load(&s->cancel_tried) ||
                           (s->group && atomic_load(&G.group_cancel_seq[s->group]) > sseq) ||
                           atomic_load(&G.queue_cancel_seq[s->queue]) > sseq;
        if (s->msg_ok && oc == FQ_CANCELLED && st == FQ_ERR_DEPENDENCY) {
            bool named = false;
            for (int d = 0; d <= s->ndeps; d++) {
                long di = d < s->ndeps ? s->dep[d] : (long)atomic_load(&s->added_dep) - 1;
                if (di >= 0 && atomic_load(&G.s[di].id) == s->named_dep &&
                    G.s[di].outcome != FQ_SUCCEEDED)
                    named = true;
            }
            if (!named) {
                s->msg_ok = false;
                example("slot %ld (%s, id %lld): FQ_ERR_DEPENDENCY message names %lld, not one of "
                        "its unsuccessful dependencies",
                        i, kn, id, (long long)s->named_dep);
            }
        }
        if (!s->msg_ok)
            BAD(bad_msg, "slot %ld (%s, id %lld): outcome %d status %d: missing or wrong error "
                "message (dependencies: %lld %lld, added %lld)", i, kn, id, oc, st,
                s->ndeps > 0 ? (long long)atomic_load(&G.s[s->dep[0]].id) : 0LL,
                s->ndeps > 1 ? (long long)atomic_load(&G.s[s->dep[1]].id) : 0LL,
                atomic_load(&s->added_dep) ? (long long)atomic_load(&G.s[atomic_load(&s->added_dep) - 1].id) : 0LL);
        /* a body that ran did so after its dependencies succeeded */
        if (runs) {
            if (atomic_load(&s->body_bad))
                BAD(dep_order, "slot %ld (%s): body saw a dependency that had not succeeded", i, kn);
            for (int d = 0; d <= s->ndeps; d++) {
                long di = d < s->ndeps ? s->dep[d] : (long)atomic_load(&s->added_dep) - 1;
                if (di < 0) continue;
                const slot *ds = &G.s[di];
                if (ds->outcome != FQ_SUCCEEDED ||
                    (!is_net(ds->kind) &&
                     !(atomic_load(&ds->end_seq) < atomic_load(&s->start_seq))))
                    BAD(dep_order,
                        "slot %ld (%s) ran (seq %lld) but dependency slot %ld (%s) ended %d "
                        "(end seq %lld)%s",
                        i, kn, (long long)atomic_load(&s->start_seq), di,
                        kind_names[ds->kind], ds->outcome, (long long)atomic_load(&ds->end_seq),
                        d == s->ndeps ? " [added by fq_add_dependency]" : "");
            }
        }
        if (cancel_ok && oc != FQ_CANCELLED)
            BAD(cancel_ok_not_cancelled,
                "slot %ld (%s, id %lld): fq_cancel returned FQ_OK but outcome %d status %d (%s)",
                i, kn, id, oc, st, fq_strerror(st));
        bool ok = true;
        switch (oc) {
        case FQ_SUCCEEDED:
            ok = st == FQ_OK && deps_ok && !cancel_ok;
            if (!is_net(s->kind)) ok = ok && runs == 1;
            if (s->kind == K_BLOCK_FAIL || s->kind == K_ASYNC_LATER_FAIL || s->kind == K_GET_500 ||
                s->kind == K_GET_TIMEOUT || s->kind == K_GET_STALL || s->kind == K_SEARCH_FAIL)
                ok = false;
            if (ok && !s->value_ok) {
                BAD(bad_value, "slot %ld (%s): succeeded with a wrong value", i, kn);
                continue;
            }
            break;
        case FQ_FAILED:
            if (st == FQ_ERR_QUEUE_TIMEOUT) {
                ok = s->maxwait > 0 && runs == 0;
            } else {
                switch (s->kind) {
                case K_BLOCK_FAIL:
                case K_ASYNC_LATER_FAIL:
                    ok = st == FQ_ERR_OPERATION && runs == 1;
                    break;
                case K_GET_500:
                case K_SEARCH_FAIL:
                    ok = st == FQ_ERR_HTTP && s->http == 500;
                    break;
                case K_GET_TIMEOUT:
                    ok = st == FQ_ERR_TIMEOUT;
                    break;
                case K_GET_STALL:
                    ok = st == FQ_ERR_TIMEOUT;
                    stall_timeouts++;
                    break;
                default:
                    ok = false;
                }
                ok = ok && deps_ok;
            }
            ok = ok && !cancel_ok;
            break;
        case FQ_CANCELLED:
            if (st == FQ_ERR_CANCELLED)
                ok = cancel_seen;
            else if (st == FQ_ERR_DEPENDENCY)
                ok = !deps_ok && runs == 0;
            else
                ok = false;
            break;
        default:
            ok = false;
        }
        if (!ok)
            BAD(implausible,
                "slot %ld (%s, id %lld, queue %s, maxwait %d, deps %d%s): outcome %d status %d "
                "(%s) http %d, body runs %d, cancel tried %d ok %d, cancel seen %d, deps ok %d",
                i, kn, id, q_names[s->queue], s->maxwait, s->ndeps,
                atomic_load(&s->added_dep) ? "+1" : "", oc, st, fq_strerror(st), s->http, runs,
                atomic_load(&s->cancel_tried), cancel_ok, cancel_seen, deps_ok);
    }
#undef BAD
    const char *R = round == 0 ? "warm-up" : "run";
    check(accepted + rejected == rr->ops && rejected == atomic_load(&G.rejected_nf) &&
              atomic_load(&G.api_bad) == 0,
          "%s: every submit accepted, or rejected for a documented reason (%ld accepted, %ld "
          "rejected: dependency no longer in history); every other call returned a documented "
          "status (%ld did not)",
          R, accepted, rejected, (long)atomic_load(&G.api_bad));
    check(missing == 0 && extra == 0,
          "%s: every accepted operation got exactly one callback (%ld missing, %ld extra)", R,
          missing, extra);
    check(spurious == 0, "%s: no callback and no body for a rejected submit (%ld)", R, spurious);
    check(wrong_id == 0, "%s: callback and body ids are the submitted id (%ld wrong)", R, wrong_id);
    check(body_twice == 0, "%s: no body ran twice (%ld)", R, body_twice);
    check(cancel_ok_not_cancelled == 0,
          "%s: every operation whose fq_cancel returned FQ_OK ended CANCELLED (%ld did not)", R,
          cancel_ok_not_cancelled);
    check(dep_order == 0,
          "%s: bodies ran only after their dependencies succeeded, with their values (%ld not)", R,
          dep_order);
    check(bad_value == 0, "%s: every success carried the expected value (%ld did not)", R,
          bad_value);
    check(bad_msg == 0,
          "%s: failures and cancels carry a message (naming the dependency for "
          "FQ_ERR_DEPENDENCY), successes none (%ld wrong)",
          R, bad_msg);
    check(implausible == 0,
          "%s: every outcome and status is plausible for what happened (%ld not)", R,
          implausible);
    check(atomic_load(&G.max_in_callback) == 1, "%s: callbacks never overlapped (max %d at once)",
          R, atomic_load(&G.max_in_callback));
    bool limits_ok = true;
    for (int q = 0; q < NQ; q++) limits_ok = limits_ok && atomic_load(&G.max_running[q]) <= q_limits[q];
    check(limits_ok, "%s: bodies running at once stayed within max_concurrent (%d/%d %d/%d %d/%d %d/%d)",
          R, atomic_load(&G.max_running[0]), q_limits[0], atomic_load(&G.max_running[1]),
          q_limits[1], atomic_load(&G.max_running[2]), q_limits[2],
          atomic_load(&G.max_running[3]), q_limits[3]);

    json_t *st = fq_engine_stats(e);
    long long sub = json_integer_value(json_object_get(st, "submitted"));
    long long su = json_integer_value(json_object_get(st, "succeeded"));
    long long fa = json_integer_value(json_object_get(st, "failed"));
    long long ca = json_integer_value(json_object_get(st, "cancelled"));
    long long qd = json_integer_value(json_object_get(st, "queued"));
    long long ru = json_integer_value(json_object_get(st, "running"));
    json_t *und = json_object_get(st, "undelivered");
    check(sub == accepted && su == rr->outcome[1] && fa == rr->outcome[2] &&
              ca == rr->outcome[3] && sub == su + fa + ca,
          "%s: stats submitted %lld == succeeded %lld + failed %lld + cancelled %lld, and match "
          "the callbacks (%ld / %ld / %ld / %ld)",
          R, sub, su, fa, ca, accepted, rr->outcome[1], rr->outcome[2], rr->outcome[3]);
    check(qd == 0 && ru == 0 && json_is_integer(und) && json_integer_value(und) == 0,
          "%s: after wait_idle queued %lld, running %lld, undelivered %lld (all 0)", R, qd, ru,
          (long long)json_integer_value(und));
    bool qok = true;
    json_t *qs = json_object_get(st, "queues");
    for (int q = 0; q < NQ; q++) {
        json_t *qo = json_object_get(qs, q_names[q]);
        long long v[6];
        static const char *k[] = {"submitted", "succeeded", "failed", "cancelled", "queued", "running"};
        for (int j = 0; j < 6; j++) v[j] = json_integer_value(json_object_get(qo, k[j]));
        if (!qo || v[0] != qsub[q] || v[1] != qout[q][1] || v[2] != qout[q][2] ||
            v[3] != qout[q][3] || v[4] != 0 || v[5] != 0) {
            qok = false;
            example("queue %s stats: %lld/%lld/%lld/%lld queued %lld running %lld; callbacks "
                    "%ld/%ld/%ld/%ld",
                    q_names[q], v[0], v[1], v[2], v[3], v[4], v[5], qsub[q], qout[q][1],
                    qout[q][2], qout[q][3]);
        }
    }
    check(qok, "%s: per-queue stats match the callbacks", R);
    json_decref(st);
    if (!quiet) {
        printf("  stall ops that hit their %d ms backstop timeout instead of being cancelled: "
               "%ld\n",
               STALL_BACKSTOP_MS, stall_timeouts);
    }
}

/* ------------------------------------------------------------------- main */

static void usage(void) {
    fprintf(stderr,
            "usage: stress [--ops N] [--seed S] [--net-permille P] [--window W] [--warmup N]\n"
            "              [--slack-mb M] [--heap-slack-kb K] [--repo DIR] [--config JSON]\n");
    exit(2);
}

int main(int argc, char **argv) {
    long ops = 1000000, warm = -1;
    int slack_mb = 16, heap_slack_kib = 1024;
    const char *repo = getenv("FQ_REPO_ROOT");
    G.seed = 20250101;
    G.net_permille = 70;
    G.window = 8000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ops") && v) ops = atol(argv[++i]);
        else if (!strcmp(a, "--seed") && v) G.seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(a, "--net-permille") && v) G.net_permille = atoi(argv[++i]);
        else if (!strcmp(a, "--window") && v) G.window = atoi(argv[++i]);
        else if (!strcmp(a, "--warmup") && v) warm = atol(argv[++i]);
        else if (!strcmp(a, "--slack-mb") && v) slack_mb = atoi(argv[++i]);
        else if (!strcmp(a, "--heap-slack-kb") && v) heap_slack_kib = atoi(argv[++i]);
        else if (!strcmp(a, "--repo") && v) repo = argv[++i];
        else if (!strcmp(a, "--config") && v) {
            json_error_t jerr;
            g_extra_config = json_loads(argv[++i], 0, &jerr);
            if (!json_is_object(g_extra_config)) {
                fprintf(stderr, "stress: --config: not a JSON object: %s\n", jerr.text);
                return 2;
            }
        }
        else usage();
    }
    if (ops < 1000 || G.net_permille < 0 || G.net_permille > 500 || G.window < 100) usage();
    if (warm < 0) warm = ops / 10 < 20000 ? ops / 10 : 20000;
    if (!repo) repo = ".";
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    printf("fetchq stress: %ld operations (+%ld warm-up), seed %llu, %d.%d%% network, window %d, "
           "libfetchq %s; bookkeeping %zu bytes per operation (%ld KiB, allocated before the "
           "start)\n",
           ops, warm, (unsigned long long)G.seed, G.net_permille / 10, G.net_permille % 10,
           G.window, fq_version_string(), sizeof(slot), (long)((warm + ops) * sizeof(slot) / 1024));

    pthread_mutex_init(&G.mu, NULL);
    pthread_cond_init(&G.cv, NULL);
    pthread_mutex_init(&G.stall_mu, NULL);
    long total = warm + ops;
    G.s = calloc((size_t)total, sizeof *G.s);
    if (!G.s) {
        perror("calloc");
        return 1;
    }
    /* touch every page now so that it counts before "start" (a memset of 0
     * after calloc may be optimized away) */
    {
        volatile char *p = (volatile char *)G.s;
        size_t bytes = (size_t)total * sizeof *G.s;
        for (size_t off = 0; off < bytes; off += 1024) p[off] = 0;
    }

    if (!server_start(repo)) return 1;
    atexit(server_stop);
    for (int t = 0; t < NTAGS; t++) {
        char target[64];
        snprintf(target, sizeof target, "/corpus?tag=%s", tags[t]);
        json_t *c = http_get_json(target);
        G.expected_count[t] = (int)json_integer_value(json_object_get(c, "count"));
        json_decref(c);
        if (G.expected_count[t] <= 0) {
            fprintf(stderr, "stress: GET %s from the test server failed\n", target);
            return 1;
        }
    }

    pthread_t sampler;
    pthread_create(&sampler, NULL, sampler_main, NULL);

    /* warm-up round on a first engine */
    round_result warm_r;
    memset(&warm_r, 0, sizeof warm_r);
    fq_engine *e0 = new_engine();
    if (!e0) return 1;
    if (!run_round(e0, 0, warm, 0, &warm_r)) {
        printf("%d passed, %d failed\n", g_pass, g_fail + 1);
        fflush(stdout);
        _exit(1);
    }
    check_round(e0, 0, 0, &warm_r, true);
    set_engine(NULL);
    check(fq_engine_free(e0) == FQ_OK, "warm-up: fq_engine_free returned FQ_OK");

    fq_engine *e1 = new_engine();
    if (!e1) return 1;
    long rss_start_raw = rss_kib();
    malloc_trim(0);
    long rss_start = rss_kib();
    long heap_start = heap_in_use_kib();
    atomic_store(&G.rss_peak, rss_start);
    json_decref(http_get_json("/stats/reset"));

    /* the big run */
    round_result rr;
    memset(&rr, 0, sizeof rr);
    atomic_store(&G.thread_cancels_ok, 0);
    atomic_store(&G.cb_cancels_ok, 0);
    atomic_store(&G.group_cancelled, 0);
    atomic_store(&G.queue_cancelled, 0);
    atomic_store(&G.stall_cancels_ok, 0);
    atomic_store(&G.adddep_ok, 0);
    atomic_store(&G.setprio_ok, 0);
    atomic_store(&G.cb_submits, 0);
    atomic_store(&G.suspends, 0);
    atomic_store(&G.snapshots, 0);
    atomic_store(&G.snapshot_mismatch, 0);
    if (!run_round(e1, warm, ops, 1, &rr)) {
        printf("%d passed, %d failed\n", g_pass, g_fail);
        fflush(stdout);
        _exit(1);
    }
    long rss_peak = atomic_load(&G.rss_peak);
    check_round(e1, warm, 1, &rr, false);

    /* what the server saw */
    json_t *ss = http_get_json("/stats");
    json_t *bp = json_object_get(ss, "by_path");
    long echo_reqs = (long)json_integer_value(json_object_get(bp, "/echo"));
    long flaky_reqs = (long)json_integer_value(json_object_get(bp, "/flaky"));
    long shared_ops = rr.by_kind[K_GET_SHARED][1] + rr.by_kind[K_GET_SHARED][2] +
                      rr.by_kind[K_GET_SHARED][3];
    long shared_ok = rr.by_kind[K_GET_SHARED][1];
    long flaky_ops = rr.by_kind[K_GET_FLAKY][1] + rr.by_kind[K_GET_FLAKY][2] +
                     rr.by_kind[K_GET_FLAKY][3];
    long flaky_ok = rr.by_kind[K_GET_FLAKY][1];
    json_decref(ss);
    if (shared_ok >= 200)
        check(echo_reqs < shared_ok,
              "coalescing: %ld identical GETs succeeded with %ld transfers seen by the server", shared_ok,
              echo_reqs);
    else
        printf("  coalescing: %ld identical GETs (%ld succeeded), %ld transfers (too few to "
               "check)\n",
               shared_ops, shared_ok, echo_reqs);
    check(flaky_reqs >= 2 * flaky_ok && flaky_reqs <= 2 * flaky_ops,
          "retries: %ld /flaky operations (%ld succeeded after one retry) made %ld requests "
          "(between %ld and %ld)",
          flaky_ops, flaky_ok, flaky_reqs, 2 * flaky_ok, 2 * flaky_ops);

    /* memory: free, a new engine, compare with the start */
    set_engine(NULL);
    check(fq_engine_free(e1) == FQ_OK, "run: fq_engine_free returned FQ_OK");
    fq_engine *e2 = new_engine();
    long rss_end_raw = rss_kib();
    malloc_trim(0);
    long rss_end = rss_kib();
    long heap_end = heap_in_use_kib();
    atomic_store(&g_sampler_stop, 1);
    pthread_join(sampler, NULL);
    long hwm = status_kib("VmHWM");

    double secs = rr.ms / 1000.0;
    printf("\nfigures\n");
    printf("  operations      %ld in %.1f s = %.0f ops/s (warm-up %ld in %.1f s)\n", rr.ops, secs,
           secs > 0 ? rr.ops / secs : 0.0, warm_r.ops, warm_r.ms / 1000.0);
    printf("  outcomes        succeeded %ld, failed %ld, cancelled %ld, rejected at submit %ld\n",
           rr.outcome[1], rr.outcome[2], rr.outcome[3], (long)atomic_load(&G.rejected_nf));
    printf("  statuses       ");
    for (int i = 0; i < 32; i++)
        if (rr.status_count[i]) printf(" %s %ld;", i == 0 ? "OK" : fq_strerror(-i), rr.status_count[i]);
    printf("\n  by kind         (succeeded/failed/cancelled)\n");
    for (int k = 0; k < K_COUNT; k++)
        printf("    %-17s %7ld %7ld %7ld\n", kind_names[k], rr.by_kind[k][1], rr.by_kind[k][2],
               rr.by_kind[k][3]);
    printf("  cancels         fq_cancel FQ_OK: %ld from a thread, %ld from callbacks, %ld stalls;"
           " %ld by group, %ld by queue cancel_all\n",
           (long)atomic_load(&G.thread_cancels_ok), (long)atomic_load(&G.cb_cancels_ok),
           (long)atomic_load(&G.stall_cancels_ok), (long)atomic_load(&G.group_cancelled),
           (long)atomic_load(&G.queue_cancelled));
    printf("  other calls     %ld follow-up submits from callbacks, %ld fq_add_dependency OK, %ld "
           "fq_set_priority OK, %ld suspends\n",
           (long)atomic_load(&G.cb_submits), (long)atomic_load(&G.adddep_ok),
           (long)atomic_load(&G.setprio_ok), (long)atomic_load(&G.suspends));
    printf("  network         %ld identical GETs -> %ld transfers; %ld /flaky ops -> %ld requests\n",
           shared_ops, echo_reqs, flaky_ops, flaky_reqs);
    printf("  stats snapshots %ld taken during the run: submitted != succeeded+failed+cancelled+"
           "queued+running in %ld (by %+ld..%+ld: shared transfers count in running, their callers "
           "in queued), != that + undelivered in %ld (information only)\n",
           (long)atomic_load(&G.snapshots), (long)atomic_load(&G.snapshot_mismatch), G.snap_dmin,
           G.snap_dmax, (long)atomic_load(&G.snapshot_mismatch2));
    printf("  RSS (KiB)       start %ld (untrimmed %ld), peak %ld (VmHWM %ld), end %ld "
           "(untrimmed %ld), growth %+ld, slack %d MiB\n",
           rss_start, rss_start_raw, rss_peak, hwm, rss_end, rss_end_raw, rss_end - rss_start,
           slack_mb);
    check(rss_end - rss_start <= slack_mb * 1024L,
          "memory: RSS after the run, fq_engine_free and a new engine is within %d MiB of the start "
          "(%+ld KiB)",
          slack_mb, rss_end - rss_start);
    printf("  heap in use     (mallinfo2, KiB) start %ld, end %ld, growth %+ld = %.0f bytes per "
           "operation, slack %d KiB\n",
           heap_start, heap_end, heap_end - heap_start,
           rr.ops ? (heap_end - heap_start) * 1024.0 / rr.ops : 0.0, heap_slack_kib);
    check(heap_end - heap_start <= heap_slack_kib,
          "memory: heap in use after the run, fq_engine_free and a new engine is within %d KiB "
          "of the start (%+ld KiB)",
          heap_slack_kib, heap_end - heap_start);
    check(fq_engine_free(e2) == FQ_OK, "fq_engine_free of the last engine returned FQ_OK");
    server_stop();
    free(G.s);
    free(G.pend_op);
    free(G.pend_slot);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
