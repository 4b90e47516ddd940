/* Scheduling: priority, QoS, aging, suspension, barriers, concurrency
 * limits, async operations holding their slot, waits with timeouts. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fqt.h"

/* Sorts pointers to recs by body start. */
static int by_start(const void *a, const void *b) {
    const rec *x = *(rec *const *)a, *y = *(rec *const *)b;
    long sx = atomic_load(&x->start_seq), sy = atomic_load(&y->start_seq);
    return (sx > sy) - (sx < sy);
}

/* Checks that the bodies of recs ran one at a time in the order `want`
 * (tags), printing both orders on a mismatch. */
static void check_start_order(rec *r, int n, const int *want) {
    rec **p = calloc((size_t)n, sizeof *p);
    REQUIRE(p);
    for (int i = 0; i < n; i++) p[i] = &r[i];
    qsort(p, (size_t)n, sizeof *p, by_start);
    bool same = true;
    for (int i = 0; i < n; i++) {
        if (atomic_load(&p[i]->body_runs) != 1) {
            FAILF("tag %d: body ran %d times, want 1", p[i]->tag,
                  atomic_load(&p[i]->body_runs));
            same = false;
        }
        if (p[i]->tag != want[i]) same = false;
        if (i > 0 && atomic_load(&p[i]->start_seq) < atomic_load(&p[i - 1]->end_seq))
            FAILF("tag %d started before tag %d ended with max_concurrent 1", p[i]->tag,
                  p[i - 1]->tag);
    }
    if (!same) {
        char got[1024] = "", exp[1024] = "";
        for (int i = 0; i < n; i++) {
            snprintf(got + strlen(got), sizeof got - strlen(got), " %d", p[i]->tag);
            snprintf(exp + strlen(exp), sizeof exp - strlen(exp), " %d", want[i]);
        }
        FAILF("start order (tags):%s; want:%s", got, exp);
    }
    free(p);
}

static int prio_value(const char *spec) {
    static const struct { const char *name; int v; } names[] = {
        {"\"very-low\"", -8}, {"\"low\"", -4}, {"\"normal\"", 0},
        {"\"high\"", 4}, {"\"very-high\"", 8}};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(spec, names[i].name) == 0) return names[i].v;
    return atoi(spec);
}

TEST(priority_order_on_resume) {
    static const char *specs[] = {
        "\"low\"", "8", "\"normal\"", "-8", "\"very-high\"", "4", "\"very-low\"", "0",
        "\"high\"", "-4", "\"low\"", "\"very-high\"", "0", "\"very-low\"", "\"high\"",
        "-4", "8", "\"normal\"", "4", "\"low\"", "-8", "0", "\"high\"", "\"very-high\""};
    enum { N = sizeof specs / sizeof *specs };
    fq_engine *e = fqt_engine("{\"aging_ms\": 0, \"workers\": 2}");
    fq_queue *q = fqt_queue(e, "prio", 1);
    CHECK_OK(fq_queue_set_suspended(q, true));
    rec r[N];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++) {
        r[i].tag = i;
        char opts[64];
        snprintf(opts, sizeof opts, "{\"priority\": %s}", specs[i]);
        CHECK(fqt_block(q, body_tag, opts, rec_done, &r[i]) > 0);
    }
    CHECK_EQ_INT(fqt_qstat(e, "prio", "queued", -1), N);
    CHECK_EQ_INT(fqt_qstat(e, "prio", "running", -1), 0);
    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));

    /* expected: higher priority first, FIFO (submission order) within a level */
    int want[N], k = 0;
    for (int level = 8; level >= -8; level -= 4)
        for (int i = 0; i < N; i++)
            if (prio_value(specs[i]) == level) want[k++] = i;
    REQUIRE(k == N);
    check_start_order(r, N, want);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(atomic_load(&r[i].calls), 1);
        CHECK_EQ_INT(r[i].outcome, FQ_SUCCEEDED);
        CHECK_EQ_INT(fqt_int(r[i].value, "tag", -1), i);
    }
    rec_clear_all(r, N);
    fqt_engine_free(e);
}

TEST(set_priority_reorders_pending) {
    fq_engine *e = fqt_engine("{\"aging_ms\": 0}");
    fq_queue *q = fqt_queue(e, "q", 1);
    CHECK_OK(fq_queue_set_suspended(q, true));
    rec r[4];
    memset(r, 0, sizeof r);
    fq_op_id id[4];
    for (int i = 0; i < 4; i++) {
        r[i].tag = i;
        id[i] = fqt_block(q, body_tag, NULL, rec_done, &r[i]);
        REQUIRE(id[i] > 0);
    }
    CHECK_OK(fq_set_priority(e, id[3], 8));
    CHECK_OK(fq_set_priority(e, id[0], -8));
    CHECK_OK(fq_set_priority(e, id[2], 4));
    CHECK_EQ_INT(fq_set_priority(e, id[1], 3), FQ_ERR_INVALID); /* not a level */
    CHECK_EQ_INT(fq_set_priority(e, id[1], 100), FQ_ERR_INVALID);
    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    const int want[4] = {3, 2, 1, 0};
    check_start_order(r, 4, want);
    rec_clear_all(r, 4);

    /* once started: FQ_ERR_STATE */
    rec a = {0};
    fq_op_id aid = fqt_async(q, body_async_capture, NULL, rec_done, &a);
    REQUIRE(aid > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&a.op) != NULL, FQT_LONG_MS));
    CHECK_EQ_INT(fq_set_priority(e, aid, 8), FQ_ERR_STATE);
    CHECK_OK(fq_op_finish(atomic_load(&a.op), NULL, NULL));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(fq_set_priority(e, aid, 8), FQ_ERR_NOT_FOUND); /* finished */
    rec_clear(&a);
    fqt_engine_free(e);
}

TEST(qos_breaks_ties_within_a_priority) {
    static const char *opts[] = {
        "{\"qos\": \"background\"}",
        "{\"qos\": \"utility\"}",
        "{\"qos\": \"default\"}",
        "{\"qos\": \"user-initiated\"}",
        "{\"qos\": \"user-interactive\"}",
        "{\"qos\": \"default\"}",
        "{\"qos\": \"background\", \"priority\": \"high\"}",
        "{\"qos\": \"user-interactive\", \"priority\": \"low\"}",
    };
    enum { N = sizeof opts / sizeof *opts };
    fq_engine *e = fqt_engine("{\"aging_ms\": 0}");
    fq_queue *q = fqt_queue(e, "q", 1);
    CHECK_OK(fq_queue_set_suspended(q, true));
    rec r[N];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++) {
        r[i].tag = i;
        CHECK(fqt_block(q, body_tag, opts[i], rec_done, &r[i]) > 0);
    }
    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    /* priority first; within "normal": QoS high to low, FIFO within a QoS */
    const int want[N] = {6, 4, 3, 2, 5, 1, 0, 7};
    check_start_order(r, N, want);
    rec_clear_all(r, N);
    fqt_engine_free(e);
}

/* A very-low operation that has waited 30 aging periods for a slot starts
 * before a very-high one that has just arrived; with aging off it does not. */
static void aging_case(bool aging_on) {
    fq_engine *e = fqt_engine(aging_on ? "{\"aging_ms\": 10}" : "{\"aging_ms\": 0}");
    fq_queue *q = fqt_queue(e, "q", 1);
    rec hold = {0}, lo = {0}, hi = {0};
    lo.tag = 1;
    hi.tag = 2;
    REQUIRE(fqt_async(q, body_async_capture, NULL, rec_done, &hold) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&hold.op) != NULL, FQT_LONG_MS));
    REQUIRE(fqt_block(q, body_tag, "{\"priority\": \"very-low\"}", rec_done, &lo) > 0);
    fqt_sleep_ms(300); /* lets `lo` age; not an assertion */
    REQUIRE(fqt_block(q, body_tag, "{\"priority\": \"very-high\"}", rec_done, &hi) > 0);
    CHECK_OK(fq_op_finish(atomic_load(&hold.op), NULL, NULL));
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&lo.body_runs), 1);
    CHECK_EQ_INT(atomic_load(&hi.body_runs), 1);
    if (aging_on) {
        if (!(atomic_load(&lo.start_seq) < atomic_load(&hi.start_seq)))
            FAILF("aging_ms 10: a very-low op waiting 300 ms did not start before a "
                  "fresh very-high one");
    } else {
        if (!(atomic_load(&hi.start_seq) < atomic_load(&lo.start_seq)))
            FAILF("aging_ms 0: the very-low op started before the very-high one");
    }
    rec_clear(&hold);
    rec_clear(&lo);
    rec_clear(&hi);
    fqt_engine_free(e);
}

TEST(aging_promotes_waiting_ops) {
    aging_case(true);
    aging_case(false);
}

TEST(suspend_resume) {
    enum { N = 5 };
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "sus", 2);
    fq_queue *other = fqt_queue(e, "other", 1);
    CHECK_OK(fq_queue_set_suspended(q, true));
    rec r[N];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++) {
        r[i].tag = i;
        REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &r[i]) > 0);
    }
    /* the engine is otherwise idle and working: another queue runs */
    rec o = {0};
    REQUIRE(fqt_block(other, body_tag, NULL, rec_done, &o) > 0);
    CHECK_OK(fq_queue_wait(other, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&o.calls), 1);
    CHECK_EQ_INT(fq_queue_wait(q, 100), FQ_ERR_TIMEOUT);
    for (int i = 0; i < N; i++) CHECK_EQ_INT(atomic_load(&r[i].body_runs), 0);
    json_t *s = fq_engine_stats(e);
    json_t *qs = json_object_get(json_object_get(s, "queues"), "sus");
    CHECK_EQ_INT(fqt_int(qs, "queued", -1), N);
    CHECK_EQ_INT(fqt_int(qs, "running", -1), 0);
    CHECK_EQ_INT(fqt_int(qs, "submitted", -1), N);
    CHECK(json_is_true(json_object_get(qs, "suspended")));
    CHECK_EQ_INT(fqt_int(s, "queued", -1), N);
    CHECK_EQ_INT(fqt_int(s, "running", -1), 0);
    json_decref(s);

    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(atomic_load(&r[i].body_runs), 1);
        CHECK_EQ_INT(r[i].outcome, FQ_SUCCEEDED);
    }
    CHECK_EQ_INT(fqt_qstat(e, "sus", "queued", -1), 0);
    CHECK_EQ_INT(fqt_qstat(e, "sus", "succeeded", -1), N);

    /* suspending does not stop a running operation; new ones wait */
    rec a = {0}, b = {0};
    REQUIRE(fqt_async(q, body_async_capture, NULL, rec_done, &a) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&a.op) != NULL, FQT_LONG_MS));
    CHECK_OK(fq_queue_set_suspended(q, true));
    REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &b) > 0);
    CHECK_EQ_INT(fqt_finish_in_thread(atomic_load(&a.op), json_integer(42), NULL), FQ_OK);
    CHECK(WAIT_UNTIL(atomic_load(&a.calls) == 1, FQT_LONG_MS));
    CHECK_EQ_INT(a.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(json_integer_value(a.value), 42);
    CHECK_EQ_INT(fq_queue_wait(q, 100), FQ_ERR_TIMEOUT);
    CHECK_EQ_INT(atomic_load(&b.body_runs), 0);
    CHECK_EQ_INT(fqt_qstat(e, "sus", "queued", -1), 1);
    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    CHECK_EQ_INT(b.outcome, FQ_SUCCEEDED);
    rec_clear_all(r, N);
    rec_clear(&o);
    rec_clear(&a);
    rec_clear(&b);
    fqt_engine_free(e);
}

/* A block body that takes a while, so that a barrier has something to wait
 * for (the sleep widens the window; no assertion depends on it). */
static json_t *body_slow_tag(fq_op *op, void *userdata) {
    rec *r = userdata;
    atomic_store(&r->start_seq, fqt_seq());
    atomic_fetch_add(&r->body_runs, 1);
    fqt_sleep_ms(15);
    (void)op;
    atomic_store(&r->end_seq, fqt_seq());
    return json_pack("{s:i}", "tag", r->tag);
}

static void barrier_case(bool start_suspended) {
    enum { BEFORE = 6, AFTER = 6 };
    fq_engine *e = fqt_engine("{\"workers\": 4}");
    fq_queue *q = fqt_queue(e, "bar", 4);
    if (start_suspended) CHECK_OK(fq_queue_set_suspended(q, true));
    rec async_before = {0}, before[BEFORE], bar = {0}, after[AFTER];
    memset(before, 0, sizeof before);
    memset(after, 0, sizeof after);
    REQUIRE(fqt_async(q, body_async_capture, NULL, rec_done, &async_before) > 0);
    for (int i = 0; i < BEFORE; i++) {
        before[i].tag = i;
        REQUIRE(fqt_block(q, body_slow_tag, NULL, rec_done, &before[i]) > 0);
    }
    bar.tag = 100;
    REQUIRE(fqt_block(q, body_slow_tag, "{\"barrier\": true}", rec_done, &bar) > 0);
    for (int i = 0; i < AFTER; i++) {
        after[i].tag = 200 + i;
        /* high priority must not let them jump the barrier */
        REQUIRE(fqt_block(q, body_tag, "{\"priority\": \"very-high\"}", rec_done,
                          &after[i]) > 0);
    }
    if (start_suspended) CHECK_OK(fq_queue_set_suspended(q, false));

    /* every block before it finishes; the barrier still waits for the async op */
    for (int i = 0; i < BEFORE; i++)
        CHECK(WAIT_UNTIL(atomic_load(&before[i].calls) == 1, FQT_LONG_MS));
    REQUIRE(WAIT_UNTIL(atomic_load(&async_before.op) != NULL, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&bar.body_runs), 0);
    for (int i = 0; i < AFTER; i++) CHECK_EQ_INT(atomic_load(&after[i].body_runs), 0);
    long async_end = fqt_seq();
    CHECK_OK(fq_op_finish(atomic_load(&async_before.op), NULL, NULL));
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));

    long bs = atomic_load(&bar.start_seq), be = atomic_load(&bar.end_seq);
    CHECK_EQ_INT(atomic_load(&bar.body_runs), 1);
    CHECK(bs > async_end);
    for (int i = 0; i < BEFORE; i++)
        if (!(atomic_load(&before[i].end_seq) < bs))
            FAILF("op %d submitted before the barrier ended (seq %ld) after it started (%ld)",
                  i, atomic_load(&before[i].end_seq), bs);
    for (int i = 0; i < AFTER; i++) {
        CHECK_EQ_INT(atomic_load(&after[i].body_runs), 1);
        if (!(atomic_load(&after[i].start_seq) > be))
            FAILF("op %d submitted after the barrier started (seq %ld) before it ended (%ld)",
                  200 + i, atomic_load(&after[i].start_seq), be);
    }
    CHECK_EQ_INT(bar.outcome, FQ_SUCCEEDED);
    rec_clear(&async_before);
    rec_clear_all(before, BEFORE);
    rec_clear(&bar);
    rec_clear_all(after, AFTER);
    fqt_engine_free(e);
}

TEST(barrier_orders_before_and_after) {
    barrier_case(false);
    barrier_case(true);
}

/* Tracks how many bodies run at once. */
static atomic_int g_running, g_max_running;

static json_t *body_count_concurrency(fq_op *op, void *userdata) {
    (void)op;
    rec *r = userdata;
    int now = atomic_fetch_add(&g_running, 1) + 1;
    int m = atomic_load(&g_max_running);
    while (now > m && !atomic_compare_exchange_weak(&g_max_running, &m, now)) {
    }
    atomic_fetch_add(&r->body_runs, 1);
    fqt_sleep_ms(3);
    atomic_fetch_sub(&g_running, 1);
    return NULL;
}

TEST(max_concurrent_and_workers_limits) {
    enum { N = 40 };
    rec r[N];
    /* the queue limit */
    fq_engine *e = fqt_engine("{\"workers\": 6}");
    fq_queue *q = fqt_queue(e, "q3", 3);
    memset(r, 0, sizeof r);
    atomic_store(&g_running, 0);
    atomic_store(&g_max_running, 0);
    for (int i = 0; i < N; i++)
        REQUIRE(fqt_block(q, body_count_concurrency, NULL, rec_done, &r[i]) > 0);
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    CHECK(atomic_load(&g_max_running) <= 3);
    CHECK(atomic_load(&g_max_running) >= 1);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(atomic_load(&r[i].calls), 1);
        CHECK(r[i].value == NULL); /* a NULL return is "no value" */
        CHECK_EQ_INT(r[i].outcome, FQ_SUCCEEDED);
    }
    fqt_engine_free(e);

    /* the worker limit across queues */
    e = fqt_engine("{\"workers\": 1}");
    fq_queue *a = fqt_queue(e, "a", 4), *b = fqt_queue(e, "b", 4);
    memset(r, 0, sizeof r);
    atomic_store(&g_running, 0);
    atomic_store(&g_max_running, 0);
    for (int i = 0; i < N; i++)
        REQUIRE(fqt_block(i % 2 ? a : b, body_count_concurrency, NULL, rec_done, &r[i]) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&g_max_running), 1);
    for (int i = 0; i < N; i++) CHECK_EQ_INT(atomic_load(&r[i].calls), 1);
    fqt_engine_free(e);
}

TEST(set_max_concurrent_grows) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    rec r[3];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 3; i++)
        REQUIRE(fqt_async(q, body_async_capture, NULL, rec_done, &r[i]) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&r[0].op) != NULL, FQT_LONG_MS));
    CHECK_EQ_INT(fq_queue_wait(q, 50), FQ_ERR_TIMEOUT);
    CHECK_EQ_INT(atomic_load(&r[1].body_runs) + atomic_load(&r[2].body_runs), 0);
    CHECK_EQ_INT(fqt_qstat(e, "q", "running", -1), 1);
    CHECK_EQ_INT(fqt_qstat(e, "q", "queued", -1), 2);
    CHECK_OK(fq_queue_set_max_concurrent(q, 3));
    CHECK(WAIT_UNTIL(atomic_load(&r[1].op) != NULL && atomic_load(&r[2].op) != NULL,
                     FQT_LONG_MS));
    CHECK_EQ_INT(fqt_qstat(e, "q", "running", -1), 3);
    for (int i = 0; i < 3; i++) {
        fq_op *op = atomic_load(&r[i].op);
        if (op) CHECK_OK(fq_op_finish(op, json_integer(i), NULL));
    }
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(json_integer_value(r[i].value), i);
    rec_clear_all(r, 3);
    fqt_engine_free(e);
}

/* The completion callback returns only after a pause: waits must include it. */
static atomic_int g_slow_cb_returned;
static void slow_done(const fq_result *res, void *userdata) {
    rec_done(res, userdata);
    fqt_sleep_ms(50);
    atomic_store(&g_slow_cb_returned, 1);
}

TEST(waits_time_out_then_succeed) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    fq_queue *idle = fqt_queue(e, "idle", 1);
    rec a = {0};
    atomic_store(&g_slow_cb_returned, 0);
    REQUIRE(fqt_async(q, body_async_capture, NULL, slow_done, &a) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&a.op) != NULL, FQT_LONG_MS));
    long long t0 = fqt_now_ms();
    CHECK_EQ_INT(fq_queue_wait(q, 50), FQ_ERR_TIMEOUT);
    CHECK(fqt_now_ms() - t0 >= 40); /* it did wait (clock granularity slack) */
    CHECK_EQ_INT(fq_engine_wait_idle(e, 50), FQ_ERR_TIMEOUT);
    CHECK_EQ_INT(fq_queue_wait(q, 0), FQ_ERR_TIMEOUT);
    CHECK_EQ_INT(fq_queue_wait(idle, 0), FQ_OK); /* another queue is idle */
    CHECK_EQ_INT(fq_queue_wait(idle, -1), FQ_OK);
    CHECK_EQ_INT(atomic_load(&a.calls), 0);
    CHECK_EQ_INT(fqt_finish_in_thread(atomic_load(&a.op), json_string("done"), NULL), FQ_OK);
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    /* "finished and its callback has returned" */
    CHECK_EQ_INT(atomic_load(&g_slow_cb_returned), 1);
    CHECK_OK(fq_engine_wait_idle(e, 0));
    CHECK_OK(fq_engine_wait_idle(e, -1));
    CHECK_STR(json_string_value(a.value), "done");
    rec_clear(&a);

    /* engine-wide wait: blocked by an op on another queue, then free */
    rec b = {0};
    atomic_store(&g_slow_cb_returned, 0);
    REQUIRE(fqt_async(idle, body_async_capture, NULL, slow_done, &b) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&b.op) != NULL, FQT_LONG_MS));
    CHECK_EQ_INT(fq_engine_wait_idle(e, 50), FQ_ERR_TIMEOUT);
    CHECK_EQ_INT(fq_queue_wait(q, 0), FQ_OK);
    CHECK_EQ_INT(fqt_finish_in_thread(atomic_load(&b.op), NULL, "it broke"), FQ_OK);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&g_slow_cb_returned), 1);
    CHECK_EQ_INT(b.outcome, FQ_FAILED);
    CHECK_EQ_INT(b.status, FQ_ERR_OPERATION);
    CHECK_STR(b.error, "it broke");
    CHECK(b.value == NULL);
    rec_clear(&b);
    fqt_engine_free(e);
}

typedef struct {
    rec *r;
    atomic_long finish_seq;
    int rc;
} finisher;

static void *finisher_main(void *p) {
    finisher *f = p;
    fq_op *op = atomic_load(&f->r->op);
    atomic_store(&f->finish_seq, fqt_seq());
    f->rc = fq_op_finish(op, json_pack("{s:i}", "v", 7), NULL);
    return NULL;
}

TEST(async_op_holds_its_slot) {
    fq_engine *e = fqt_engine("{\"workers\": 4}");
    fq_queue *q = fqt_queue(e, "one", 1);
    rec a = {0}, b = {0};
    fq_op_id aid = fqt_async(q, body_async_capture, NULL, rec_done, &a);
    REQUIRE(aid > 0);
    REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &b) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&a.op) != NULL, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&a.body_id), aid);
    /* the start function returned long ago; the op still holds the only slot */
    CHECK_EQ_INT(fq_queue_wait(q, 100), FQ_ERR_TIMEOUT);
    CHECK_EQ_INT(atomic_load(&b.body_runs), 0);
    CHECK_EQ_INT(atomic_load(&a.calls), 0);
    CHECK_EQ_INT(fqt_qstat(e, "one", "running", -1), 1);
    CHECK_EQ_INT(fqt_qstat(e, "one", "queued", -1), 1);
    CHECK(!fq_op_is_cancelled(atomic_load(&a.op)));

    finisher f = {.r = &a, .rc = 12345};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, finisher_main, &f) == 0);
    pthread_join(t, NULL);
    CHECK_EQ_INT(f.rc, FQ_OK);
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&b.body_runs), 1);
    CHECK(atomic_load(&b.start_seq) > atomic_load(&f.finish_seq));
    CHECK_EQ_INT(a.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(a.id, aid);
    CHECK_EQ_INT(fqt_int(a.value, "v", -1), 7);
    CHECK_EQ_INT(b.outcome, FQ_SUCCEEDED);
    rec_clear(&a);
    rec_clear(&b);
    fqt_engine_free(e);
}

TEST(max_wait_ms_fails_waiting_ops) {
    fq_engine *e = fqt_engine("{\"max_wait_ms\": 50}");
    fq_queue *q = fqt_queue(e, "q", 1);
    rec hold = {0}, patient = {0}, w_default = {0}, w_option = {0};
    REQUIRE(fqt_async(q, body_async_capture, "{\"max_wait_ms\": 0}", rec_done, &hold) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&hold.op) != NULL, FQT_LONG_MS));
    REQUIRE(fqt_block(q, body_tag, "{\"max_wait_ms\": 0}", rec_done, &patient) > 0);
    REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &w_default) > 0);
    REQUIRE(fqt_block(q, body_tag, "{\"max_wait_ms\": 30}", rec_done, &w_option) > 0);
    CHECK(WAIT_UNTIL(atomic_load(&w_default.calls) == 1 && atomic_load(&w_option.calls) == 1,
                     FQT_LONG_MS));
    CHECK_EQ_INT(w_default.outcome, FQ_FAILED);
    CHECK_EQ_INT(w_default.status, FQ_ERR_QUEUE_TIMEOUT);
    CHECK(w_default.has_error);
    CHECK_EQ_INT(w_option.outcome, FQ_FAILED);
    CHECK_EQ_INT(w_option.status, FQ_ERR_QUEUE_TIMEOUT);
    CHECK_EQ_INT(atomic_load(&w_default.body_runs) + atomic_load(&w_option.body_runs), 0);
    /* max_wait_ms 0 overrides the engine's 50: still waiting */
    CHECK_EQ_INT(atomic_load(&patient.calls), 0);
    CHECK_EQ_INT(atomic_load(&hold.calls), 0); /* running ops are not timed out */
    CHECK_OK(fq_op_finish(atomic_load(&hold.op), NULL, NULL));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(hold.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(patient.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(fqt_stat(e, "failed", -1), 2);
    rec_clear(&hold);
    rec_clear(&patient);
    rec_clear(&w_default);
    rec_clear(&w_option);
    fqt_engine_free(e);
}

/* Many queues, some idle, some suspended, half freed and their names taken
 * again while their operations still wait: every operation runs once, in
 * its own queue. (The scheduler looks only at queues with ready operations
 * and finds names by a table: with 10 000 idle queues each start had
 * looked at all of them, the fifth review.) */
TEST(many_queues_idle_suspended_freed_and_named_again) {
    enum { NQ = 600, PER = 3 };
    fq_engine *e = fqt_engine(NULL);
    static fq_queue *qs[NQ], *again[NQ / 2];
    static rec r[NQ][PER], r2[NQ / 2];
    memset(r, 0, sizeof r);
    memset(r2, 0, sizeof r2);
    char name[32];
    for (int i = 0; i < NQ; i++) {
        snprintf(name, sizeof name, "q%d", i);
        qs[i] = fqt_queue(e, name, 1 + i % 3);
        if (i % 4 == 1) CHECK_OK(fq_queue_set_suspended(qs[i], true));
        if (i % 4 == 3) continue; /* idle */
        for (int k = 0; k < PER; k++) {
            r[i][k].tag = i * PER + k;
            REQUIRE(fqt_block(qs[i], body_tag, NULL, rec_done, &r[i][k]) > 0);
        }
    }
    snprintf(name, sizeof name, "q%d", 5);
    CHECK_EQ_INT(fq_queue_new(e, name, 1) == NULL, 1); /* the name is taken */
    /* Free the even queues: their work not started yet is cancelled, and
     * their names are free again at once. */
    for (int i = 0; i < NQ; i += 2) fq_queue_free(qs[i]);
    for (int i = 0; i < NQ / 2; i++) {
        snprintf(name, sizeof name, "q%d", 2 * i);
        again[i] = fqt_queue(e, name, 1);
        r2[i].tag = -i;
        REQUIRE(fqt_block(again[i], body_tag, NULL, rec_done, &r2[i]) > 0);
    }
    for (int i = 1; i < NQ; i += 4) CHECK_OK(fq_queue_set_suspended(qs[i], false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < NQ; i++) {
        if (i % 4 == 3) continue;
        for (int k = 0; k < PER; k++) {
            CHECK_EQ_INT(atomic_load(&r[i][k].calls), 1);
            if (i % 2 == 1) CHECK_EQ_INT(r[i][k].outcome, FQ_SUCCEEDED);
            if (r[i][k].outcome == FQ_SUCCEEDED) CHECK_EQ_INT(json_integer_value(json_object_get(r[i][k].value, "tag")), i * PER + k);
        }
    }
    for (int i = 0; i < NQ / 2; i++) {
        CHECK_EQ_INT(atomic_load(&r2[i].calls), 1);
        CHECK_EQ_INT(r2[i].outcome, FQ_SUCCEEDED);
        CHECK_EQ_INT(json_integer_value(json_object_get(r2[i].value, "tag")), -i);
    }
    for (int i = 0; i < NQ; i++)
        for (int k = 0; k < PER; k++) rec_clear(&r[i][k]);
    for (int i = 0; i < NQ / 2; i++) rec_clear(&r2[i]);
    fqt_engine_free(e);
}

/* fq_engine_stats keys "queues" by the names of LIVE queues: a freed queue
 * whose operation still runs is no longer listed, and a new queue given its
 * name is listed with its own counters (the freed one's were shown under the
 * name, or written over it, when closed queues were not left out). */
TEST(stats_leave_out_a_freed_queue_whose_operation_still_runs) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    rec held = {0};
    REQUIRE(fqt_async(q, body_async_capture, NULL, rec_done, &held) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&held.op) != NULL, FQT_LONG_MS));
    fq_queue_free(q); /* the running async op goes on */
    json_t *s = fq_engine_stats(e);
    REQUIRE(s != NULL);
    CHECK_EQ_INT(fqt_int(s, "running", -1), 1);
    CHECK(json_object_get(json_object_get(s, "queues"), "q") == NULL);
    json_decref(s);
    fq_queue *again = fqt_queue(e, "q", 3);
    s = fq_engine_stats(e);
    json_t *qs = json_object_get(json_object_get(s, "queues"), "q");
    CHECK_EQ_INT(fqt_int(qs, "max_concurrent", -1), 3);
    CHECK_EQ_INT(fqt_int(qs, "running", -1), 0);
    CHECK_EQ_INT(fqt_int(qs, "submitted", -1), 0);
    json_decref(s);
    CHECK_OK(fqt_finish_in_thread(atomic_load(&held.op), NULL, NULL));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&held.calls), 1);
    CHECK_EQ_INT(held.outcome, FQ_SUCCEEDED);
    rec_clear(&held);
    fq_queue_free(again);
    fqt_engine_free(e);
}
