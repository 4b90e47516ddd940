/*
 * fq_bench — the fetchq side of the benchmarks in BENCHMARKS.md, written
 * against the C ABI (build/lib/libfetchq.so, include/fetchq.h).
 *
 *   fq_bench p1 plain|prio|chain N          N no-op block ops, queue max 2
 *   fq_bench p2 URL N C                     N GET + JSON parse, queue max C
 *   fq_bench p5 block|request N [URL]       RSS per op queued on a suspended queue
 *   fq_bench p6 N                           cancel-all of N queued ops
 *   fq_bench p7 TEMPLATE N C                N searches, queue max C
 *
 * FQ_BENCH_WINDOW=W (environment, optional, p2 only): submit W requests, then
 * one more from each completion callback, so at most W are queued or running
 * (instead of all N at once); echoed as "window".
 *
 * FQ_BENCH_CONFIG (environment, optional): a JSON object merged into every
 * engine config, for experiments (e.g. '{"history": 0}'); echoed as "config".
 *
 * FQ_BENCH_LATENCY=1 (environment, optional, p2 and p7): each completion
 * callback also reads the result's metrics (fq_result_metrics builds a JSON
 * object) and the time since its submit, and the run reports their
 * percentiles as "latency". Off by default: the anchors read nothing like
 * it, so the throughput runs do not either, and the latency rows come from
 * runs of their own (bench/findings.md, "Seventeenth round"). Off, "latency"
 * is null.
 *
 * Each run prints one JSON object on stdout (report.py reads it); errors go
 * to stderr with a non-zero exit status. A run that loses or fails an
 * operation is an error, not a number.
 */
#define _GNU_SOURCE
#include <fetchq.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what) {
    fprintf(stderr, "fq_bench: %s: %s\n", what, fq_last_error());
    exit(1);
}

static const char *extra_config; /* FQ_BENCH_CONFIG */

static fq_engine *engine_new(json_t *config) {
    if (extra_config) {
        json_error_t jerr;
        json_t *more = json_loads(extra_config, 0, &jerr);
        if (!json_is_object(more)) {
            fprintf(stderr, "fq_bench: FQ_BENCH_CONFIG is not a JSON object: %s\n", jerr.text);
            exit(2);
        }
        json_object_update(config, more);
        json_decref(more);
    }
    char err[512];
    fq_engine *e = fq_engine_new(config, err, sizeof err);
    if (!e) {
        fprintf(stderr, "fq_bench: fq_engine_new: %s\n", err);
        exit(1);
    }
    json_decref(config);
    return e;
}

/* ---- counters shared by the callbacks -------------------------------- */

static atomic_long done_ok;
static atomic_long done_bad;
static atomic_long done_cancelled;

/* Latencies from the engine's own metrics, written by the (serialized)
 * delivery thread; indexed by completion order. */
static double *lat_wait, *lat_total, *lat_e2e;
static long lat_n, lat_cap;
/* Submit time of each network op (index = userdata), for submit->callback. */
static double *submitted_at;
static int measure_latency; /* FQ_BENCH_LATENCY */

static void on_done_count(const fq_result *r, void *ud) {
    (void)ud;
    switch (fq_result_outcome(r)) {
    case FQ_SUCCEEDED: atomic_fetch_add_explicit(&done_ok, 1, memory_order_relaxed); break;
    case FQ_CANCELLED: atomic_fetch_add_explicit(&done_cancelled, 1, memory_order_relaxed); break;
    default:
        if (atomic_fetch_add(&done_bad, 1) < 3)
            fprintf(stderr, "fq_bench: op %lld failed: %s\n", (long long)fq_result_op_id(r),
                    fq_result_error(r) ? fq_result_error(r) : "?");
    }
}

static json_t *noop_body(fq_op *op, void *ud) {
    (void)op;
    (void)ud;
    return NULL;
}

static double now_s(void);
static void p2_submit_next(void);
static long window; /* FQ_BENCH_WINDOW */

/* A network completion: the request must have succeeded with a parsed JSON
 * object holding a non-empty array "items" (P2's document and P7's search
 * value both do; the P7 anchor rejects an empty result list too);
 * records the engine's queue wait and total time, and submit->callback. */
static void on_done_network(const fq_result *r, void *ud) {
    long index = (long)(intptr_t)ud;
    json_t *v = fq_result_value(r);
    if (fq_result_outcome(r) != FQ_SUCCEEDED || !json_is_object(v) ||
        json_array_size(json_object_get(v, "items")) == 0) {
        if (atomic_fetch_add(&done_bad, 1) < 3)
            fprintf(stderr, "fq_bench: op %lld: outcome %d status %ld: %s\n", (long long)fq_result_op_id(r),
                    fq_result_outcome(r), fq_result_http_status(r),
                    fq_result_error(r) ? fq_result_error(r) : "unexpected value");
        return;
    }
    json_t *m = measure_latency ? fq_result_metrics(r) : NULL; /* BORROWED for the callback */
    if (m && lat_n < lat_cap) {
        lat_wait[lat_n] = json_number_value(json_object_get(m, "queue_wait_ms"));
        lat_total[lat_n] = json_number_value(json_object_get(m, "total_ms"));
        lat_e2e[lat_n] = (now_s() - submitted_at[index]) * 1e3;
        lat_n++;
    }
    if (window) p2_submit_next();
    atomic_fetch_add_explicit(&done_ok, 1, memory_order_relaxed);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, long n, double p) {
    if (n == 0) return 0;
    long i = (long)(p * (double)(n - 1) + 0.5);
    return v[i];
}

/* {"queue_wait_ms", "total_ms" (the engine's metrics), "callback_ms"
 * (submit -> callback, measured here): {"p50", "p99"} each} */
static json_t *latency_json(void) {
    if (!measure_latency) return json_null();
    qsort(lat_wait, (size_t)lat_n, sizeof *lat_wait, cmp_double);
    qsort(lat_total, (size_t)lat_n, sizeof *lat_total, cmp_double);
    qsort(lat_e2e, (size_t)lat_n, sizeof *lat_e2e, cmp_double);
    return json_pack("{s:{s:f,s:f},s:{s:f,s:f},s:{s:f,s:f}}",
                     "queue_wait_ms", "p50", pct(lat_wait, lat_n, .5), "p99", pct(lat_wait, lat_n, .99),
                     "total_ms", "p50", pct(lat_total, lat_n, .5), "p99", pct(lat_total, lat_n, .99),
                     "callback_ms", "p50", pct(lat_e2e, lat_n, .5), "p99", pct(lat_e2e, lat_n, .99));
}

static void lat_alloc(long n) {
    lat_cap = n;
    lat_wait = calloc((size_t)n, sizeof *lat_wait);
    lat_total = calloc((size_t)n, sizeof *lat_total);
    lat_e2e = calloc((size_t)n, sizeof *lat_e2e);
    submitted_at = calloc((size_t)n, sizeof *submitted_at);
}

static void emit(json_t *o) {
    if (extra_config) json_object_set_new(o, "config", json_string(extra_config));
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
    puts(s);
    free(s);
    json_decref(o);
}

static void check_all(long n) {
    long ok = atomic_load(&done_ok), bad = atomic_load(&done_bad), c = atomic_load(&done_cancelled);
    if (ok != n || bad || c) {
        fprintf(stderr, "fq_bench: expected %ld successes, got %ld ok, %ld failed, %ld cancelled\n", n, ok, bad, c);
        exit(1);
    }
}

/* ---- P1: no-op ops through a queue of max 2 --------------------------- */

static int p1(const char *variant, long n) {
    fq_engine *e = engine_new(json_object());
    fq_queue *q = fq_queue_new(e, "p1", 2);
    if (!q) die("fq_queue_new");
    enum { PLAIN, PRIO, CHAIN } v = !strcmp(variant, "plain") ? PLAIN : !strcmp(variant, "prio") ? PRIO
                                   : !strcmp(variant, "chain") ? CHAIN : -1;
    if ((int)v < 0) {
        fprintf(stderr, "fq_bench p1: variant plain|prio|chain\n");
        return 2;
    }
    /* Options built once (like the anchor's queuePriority values); a chain
     * needs its own depends_on per op, built in the timed loop. */
    static const int levels[5] = {-8, -4, 0, 4, 8};
    json_t *prio[5];
    for (int i = 0; i < 5; i++) prio[i] = json_pack("{s:i}", "priority", levels[i]);
    json_t *chain = json_pack("{s:[I]}", "depends_on", (json_int_t)1);
    json_t *chain_id = json_array_get(json_object_get(chain, "depends_on"), 0);

    double t0 = now_s();
    fq_op_id prev = 0;
    for (long i = 0; i < n; i++) {
        const json_t *opts = NULL;
        if (v == PRIO) opts = prio[i % 5];
        else if (v == CHAIN && prev > 0) {
            json_integer_set(chain_id, prev);
            opts = chain;
        }
        prev = fq_submit_block(q, noop_body, opts, on_done_count, NULL);
        if (prev <= 0) die("fq_submit_block");
    }
    double t_submit = now_s() - t0;
    if (fq_queue_wait(q, -1) != FQ_OK) die("fq_queue_wait");
    double t = now_s() - t0;
    check_all(n);
    fq_engine_free(e);
    for (int i = 0; i < 5; i++) json_decref(prio[i]);
    json_decref(chain);
    emit(json_pack("{s:s,s:s,s:I,s:f,s:f,s:f}", "bench", "p1", "variant", variant, "n", (json_int_t)n,
                   "seconds", t, "submit_seconds", t_submit, "rate", (double)n / t));
    return 0;
}

/* ---- P2: GET + JSON parse ------------------------------------------------ */

static struct {
    pthread_mutex_t lock; /* the main thread and the delivery thread submit */
    fq_queue *q;
    json_t *req, *opts;
    const char *base;
    long next, n;
} p2s = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void p2_submit_next(void) {
    char url[1024];
    pthread_mutex_lock(&p2s.lock);
    if (p2s.next < p2s.n) {
        long i = p2s.next++;
        snprintf(url, sizeof url, "%s?i=%ld", p2s.base, i);
        json_object_set_new(p2s.req, "url", json_string(url));
        if (measure_latency) submitted_at[i] = now_s();
        if (fq_submit_request(p2s.q, p2s.req, p2s.opts, on_done_network, (void *)(intptr_t)i) <= 0)
            die("fq_submit_request");
    }
    pthread_mutex_unlock(&p2s.lock);
}

static int p2(const char *base, long n, int c) {
    fq_engine *e = engine_new(json_pack("{s:i}", "max_per_host", c));
    fq_queue *q = fq_queue_new(e, "p2", c);
    if (!q) die("fq_queue_new");
    lat_alloc(n);
    /* Distinct URLs and "coalesce": false: every op is its own transfer. */
    p2s.opts = json_pack("{s:b,s:s}", "coalesce", 0, "parse", "json");
    p2s.req = json_object();
    p2s.q = q;
    p2s.base = base;
    p2s.n = n;
    double t0 = now_s();
    for (long i = 0; i < (window ? window : n); i++) p2_submit_next();
    if (fq_queue_wait(q, -1) != FQ_OK) die("fq_queue_wait");
    double t = now_s() - t0;
    check_all(n);
    fq_engine_free(e);
    json_decref(p2s.req);
    json_decref(p2s.opts);
    emit(json_pack("{s:s,s:I,s:i,s:f,s:f,s:o,s:I}", "bench", "p2", "n", (json_int_t)n, "concurrency", c,
                   "seconds", t, "rate", (double)n / t, "latency", latency_json(), "window", (json_int_t)window));
    return 0;
}

/* ---- P5: memory per queued op ---------------------------------------------- */

static long rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = 0;
    if (!f || fscanf(f, "%ld %ld", &size, &resident) != 2) {
        fprintf(stderr, "fq_bench: cannot read /proc/self/statm\n");
        exit(1);
    }
    fclose(f);
    return resident * sysconf(_SC_PAGESIZE);
}

static int p5(const char *kind, long n, const char *url) {
    int request = !strcmp(kind, "request");
    if (request && !url) {
        fprintf(stderr, "fq_bench p5 request N URL\n");
        return 2;
    }
    fq_engine *e = engine_new(json_object());
    fq_queue *q = fq_queue_new(e, "p5", 2);
    if (!q) die("fq_queue_new");
    /* Warm up: threads started, allocator arenas and the engine's tables in
     * use, so the delta below is what the queued operations themselves cost. */
    for (int i = 0; i < 2000; i++)
        if (fq_submit_block(q, noop_body, NULL, NULL, NULL) <= 0) die("fq_submit_block");
    fq_queue_wait(q, -1);
    fq_queue_set_suspended(q, true);
    json_t *req = json_pack("{s:s}", "url", url ? url : "");
    json_t *opts = json_pack("{s:b}", "coalesce", 0);
    char buf[1024];
    long before = rss_bytes();
    for (long i = 0; i < n; i++) {
        fq_op_id id;
        if (request) {
            snprintf(buf, sizeof buf, "%s?i=%ld", url, i);
            json_object_set_new(req, "url", json_string(buf));
            id = fq_submit_request(q, req, opts, on_done_count, NULL);
        } else {
            id = fq_submit_block(q, noop_body, NULL, on_done_count, NULL);
        }
        if (id <= 0) die("submit");
    }
    long after = rss_bytes();
    fq_queue_cancel_all(q);
    fq_queue_wait(q, -1);
    if (atomic_load(&done_cancelled) != n) {
        fprintf(stderr, "fq_bench p5: %ld of %ld cancelled\n", atomic_load(&done_cancelled), n);
        return 1;
    }
    fq_engine_free(e);
    json_decref(req);
    json_decref(opts);
    emit(json_pack("{s:s,s:s,s:I,s:I,s:I,s:f}", "bench", "p5", "variant", kind, "n", (json_int_t)n,
                   "rss_before", (json_int_t)before, "rss_after", (json_int_t)after,
                   "bytes_per_op", (double)(after - before) / (double)n));
    return 0;
}

/* ---- P6: cancel-all until every callback ran -------------------------------- */

static int p6(long n) {
    fq_engine *e = engine_new(json_object());
    fq_queue *q = fq_queue_new(e, "p6", 2);
    if (!q) die("fq_queue_new");
    fq_queue_set_suspended(q, true);
    for (long i = 0; i < n; i++)
        if (fq_submit_block(q, noop_body, NULL, on_done_count, NULL) <= 0) die("fq_submit_block");
    double t0 = now_s();
    int cancelled = fq_queue_cancel_all(q);
    double t_call = now_s() - t0;
    if (fq_queue_wait(q, -1) != FQ_OK) die("fq_queue_wait");
    double t = now_s() - t0;
    if (cancelled != n || atomic_load(&done_cancelled) != n) {
        fprintf(stderr, "fq_bench p6: cancel_all said %d, %ld callbacks CANCELLED, of %ld\n", cancelled,
                atomic_load(&done_cancelled), n);
        return 1;
    }
    fq_engine_free(e);
    emit(json_pack("{s:s,s:I,s:f,s:f}", "bench", "p6", "n", (json_int_t)n, "ms", t * 1e3, "cancel_call_ms",
                   t_call * 1e3));
    return 0;
}

/* ---- P7: searches ---------------------------------------------------------------- */

static int p7(const char *template, long n, int c) {
    json_t *cfg = json_pack("{s:i,s:{s:s,s:s,s:s,s:s,s:s}}", "max_per_host", c, "search", "url", template,
                            "results", "/results", "id", "/id", "sort", "/score", "order", "desc");
    fq_engine *e = engine_new(cfg);
    fq_queue *q = fq_queue_new(e, "p7", c);
    if (!q) die("fq_queue_new");
    lat_alloc(n);
    char query[64];
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        snprintf(query, sizeof query, "q%ld \xc3\xbc", i); /* "qN ü", as bench/gen_data.py names them */
        if (measure_latency) submitted_at[i] = now_s();
        if (fq_submit_search(q, query, NULL, on_done_network, (void *)(intptr_t)i) <= 0) die("fq_submit_search");
    }
    if (fq_queue_wait(q, -1) != FQ_OK) die("fq_queue_wait");
    double t = now_s() - t0;
    check_all(n);
    fq_engine_free(e);
    emit(json_pack("{s:s,s:I,s:i,s:f,s:f,s:o}", "bench", "p7", "n", (json_int_t)n, "concurrency", c,
                   "seconds", t, "rate", (double)n / t, "latency", latency_json()));
    return 0;
}

int main(int argc, char **argv) {
    if (fq_version() != FQ_VERSION_HEX) {
        fprintf(stderr, "fq_bench: header %s, library %s\n", FQ_VERSION_STRING, fq_version_string());
        return 1;
    }
    extra_config = getenv("FQ_BENCH_CONFIG");
    window = getenv("FQ_BENCH_WINDOW") ? atol(getenv("FQ_BENCH_WINDOW")) : 0;
    measure_latency = getenv("FQ_BENCH_LATENCY") && !strcmp(getenv("FQ_BENCH_LATENCY"), "1");
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "p1") && argc == 4) return p1(argv[2], atol(argv[3]));
    if (!strcmp(mode, "p2") && argc == 5) return p2(argv[2], atol(argv[3]), atoi(argv[4]));
    if (!strcmp(mode, "p5") && argc >= 4) return p5(argv[2], atol(argv[3]), argc > 4 ? argv[4] : NULL);
    if (!strcmp(mode, "p6") && argc == 3) return p6(atol(argv[2]));
    if (!strcmp(mode, "p7") && argc == 5) return p7(argv[2], atol(argv[3]), atoi(argv[4]));
    fprintf(stderr, "usage: fq_bench p1 plain|prio|chain N | p2 URL N C | p5 block|request N [URL] | p6 N | "
                    "p7 TEMPLATE N C\n");
    return 2;
}
