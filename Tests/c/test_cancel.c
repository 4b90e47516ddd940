/* Cancellation (one, group, queue, engine), queue release, re-entrant calls
 * from callbacks and bodies, engine free with pending and running work. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fqt.h"

static void check_cancelled(const rec *r, const char *what) {
    if (atomic_load(&r->calls) != 1)
        FAILF("%s: %d callbacks, want 1", what, atomic_load(&r->calls));
    if (r->outcome != FQ_CANCELLED)
        FAILF("%s: outcome %d, want FQ_CANCELLED", what, r->outcome);
    if (r->status != FQ_ERR_CANCELLED)
        FAILF("%s: status %d (%s), want FQ_ERR_CANCELLED", what, r->status,
              fq_strerror(r->status));
    if (!r->has_error || !r->error[0])
        FAILF("%s: no error message for a cancelled operation", what);
}

TEST(cancel_before_start) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    CHECK_OK(fq_queue_set_suspended(q, true));
    rec x = {0}, y = {0}, z = {0};
    fq_op_id idx = fqt_block(q, body_tag, NULL, rec_done, &x);
    fq_op_id idy = fqt_async(q, body_async_capture, NULL, rec_done, &y);
    fq_op_id idz = fqt_block(q, body_tag, NULL, rec_done, &z);
    REQUIRE(idx > 0 && idy > 0 && idz > 0);
    CHECK_OK(fq_cancel(e, idx));
    CHECK_OK(fq_cancel(e, idy));
    /* cancelled before starting: ends at once, even in a suspended queue */
    CHECK(WAIT_UNTIL(atomic_load(&x.calls) == 1 && atomic_load(&y.calls) == 1, FQT_LONG_MS));
    CHECK_EQ_INT(fqt_qstat(e, "q", "queued", -1), 1);
    CHECK_EQ_INT(fqt_qstat(e, "q", "cancelled", -1), 2);
    /* cancelling again: harmless, and never a second callback */
    int again = fq_cancel(e, idx);
    if (again != FQ_OK && again != FQ_ERR_NOT_FOUND)
        FAILF("second fq_cancel of a cancelled pending op = %d", again);
    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    check_cancelled(&x, "block cancelled before start");
    check_cancelled(&y, "async cancelled before start");
    CHECK(x.value == NULL && y.value == NULL);
    CHECK_EQ_INT(x.id, idx);
    CHECK_EQ_INT(y.id, idy);
    CHECK_EQ_INT(atomic_load(&x.body_runs), 0);
    CHECK_EQ_INT(atomic_load(&y.body_runs), 0);
    CHECK_EQ_INT(z.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(fq_cancel(e, idz), FQ_ERR_NOT_FOUND); /* already finished */
    rec_clear(&x);
    rec_clear(&y);
    rec_clear(&z);
    fqt_engine_free(e);
}

static atomic_int g_release;

/* Runs until it sees the cancellation and the test releases it (bounded). */
static json_t *body_until_cancelled(fq_op *op, void *userdata) {
    rec *r = userdata;
    atomic_store(&r->start_seq, fqt_seq());
    atomic_fetch_add(&r->body_runs, 1);
    long long deadline = fqt_now_ms() + h_scaled_ms(FQT_LONG_MS);
    while (!(fq_op_is_cancelled(op) && atomic_load(&g_release)) && fqt_now_ms() < deadline)
        fqt_sleep_ms(1);
    r->tag = fq_op_is_cancelled(op) ? 1 : 0;
    atomic_store(&r->end_seq, fqt_seq());
    return json_string("value of a cancelled op");
}

TEST(cancel_running_ops) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    atomic_store(&g_release, 0);
    rec b = {0}, a = {0};
    fq_op_id idb = fqt_block(q, body_until_cancelled, NULL, rec_done, &b);
    fq_op_id ida = fqt_async(q, body_async_capture, NULL, rec_done, &a);
    REQUIRE(idb > 0 && ida > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&b.body_runs) == 1 && atomic_load(&a.op) != NULL,
                       FQT_LONG_MS));
    fq_op *aop = atomic_load(&a.op);
    CHECK(!fq_op_is_cancelled(aop));
    CHECK_OK(fq_cancel(e, idb));
    CHECK_OK(fq_cancel(e, idb)); /* twice: harmless while it runs */
    CHECK_OK(fq_cancel(e, ida));
    CHECK_OK(fq_cancel(e, ida));
    CHECK(fq_op_is_cancelled(aop));
    CHECK_EQ_INT(fqt_qstat(e, "q", "running", -1), 2); /* still running */
    CHECK_EQ_INT(fq_queue_wait(q, 50), FQ_ERR_TIMEOUT);
    atomic_store(&g_release, 1);
    CHECK_EQ_INT(fqt_finish_in_thread(aop, json_string("late value"), NULL), FQ_OK);
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    CHECK_EQ_INT(b.tag, 1); /* the body saw fq_op_is_cancelled() */
    check_cancelled(&b, "running block op");
    check_cancelled(&a, "running async op");
    /* Cancelled already: cancelling again is harmless (FQ_OK, see fq_cancel). */
    CHECK_EQ_INT(fq_cancel(e, idb), FQ_OK);
    CHECK_EQ_INT(fq_cancel(e, ida), FQ_OK);
    rec_clear(&b);
    rec_clear(&a);
    fqt_engine_free(e);
}

/* With more started than workers ("workers": 1, max_concurrent 3), two
 * operations counted as running wait for the worker. Cancelled there, they
 * end FQ_CANCELLED without their body or start function running (the body
 * ran, after fq_cancel had returned FQ_OK; the sixth review). */
TEST(cancel_started_ops_waiting_for_a_worker) {
    fq_engine *e = fqt_engine("{\"workers\": 1}");
    fq_queue *q = fqt_queue(e, "q", 3);
    atomic_store(&g_release, 0);
    rec hold = {0}, b = {0}, a = {0};
    fq_op_id idh = fqt_block(q, body_until_cancelled, NULL, rec_done, &hold);
    REQUIRE(idh > 0 && WAIT_UNTIL(atomic_load(&hold.body_runs) == 1, FQT_LONG_MS));
    fq_op_id idb = fqt_block(q, body_tag, NULL, rec_done, &b);
    fq_op_id ida = fqt_async(q, body_async_capture, NULL, rec_done, &a);
    REQUIRE(idb > 0 && ida > 0);
    CHECK_EQ_INT(fqt_qstat(e, "q", "running", -1), 3); /* started: handed to the worker */
    CHECK_OK(fq_cancel(e, idb));
    CHECK_OK(fq_cancel(e, ida));
    CHECK_OK(fq_cancel(e, idh));
    atomic_store(&g_release, 1);
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    check_cancelled(&b, "block op cancelled while waiting for a worker");
    check_cancelled(&a, "async op cancelled while waiting for a worker");
    CHECK_EQ_INT(atomic_load(&b.body_runs), 0);
    CHECK_EQ_INT(atomic_load(&a.body_runs), 0);
    CHECK(atomic_load(&a.op) == NULL); /* its start function never ran */
    check_cancelled(&hold, "the running block op");
    CHECK_EQ_INT(fqt_qstat(e, "q", "cancelled", -1), 3);
    rec_clear(&hold);
    rec_clear(&b);
    rec_clear(&a);
    fqt_engine_free(e);
}

TEST(cancel_group_only_that_group) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *qa = fqt_queue(e, "qa", 2);
    fq_queue *qb = fqt_queue(e, "qb", 2);
    fq_queue *qc = fqt_queue(e, "qc", 2);
    /* a running g1 member on qc */
    rec run = {0};
    REQUIRE(fqt_async(qc, body_async_capture, "{\"group\": \"g1\"}", rec_done, &run) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&run.op) != NULL, FQT_LONG_MS));
    CHECK_OK(fq_queue_set_suspended(qa, true));
    CHECK_OK(fq_queue_set_suspended(qb, true));
    enum { N = 7 };
    static const char *opts[N] = {
        "{\"group\": \"g1\"}", "{\"group\": \"g2\"}", "{\"group\": \"g1\"}",
        "{\"group\": \"g2\"}", "{\"group\": \"g1\"}", NULL, "{\"group\": \"g10\"}"};
    const bool in_g1[N] = {true, false, true, false, true, false, false};
    rec r[N];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++) {
        r[i].tag = i;
        REQUIRE(fqt_block(i % 2 ? qb : qa, body_tag, opts[i], rec_done, &r[i]) > 0);
    }
    CHECK_EQ_INT(fq_cancel_group(e, "g1"), 4); /* 3 pending + 1 running */
    CHECK_EQ_INT(fq_cancel_group(e, "g"), 0);  /* no prefix matching */
    CHECK_EQ_INT(fq_cancel_group(e, ""), 0);
    CHECK(fq_op_is_cancelled(atomic_load(&run.op)));
    CHECK_OK(fq_op_finish(atomic_load(&run.op), json_true(), NULL));
    CHECK_OK(fq_queue_set_suspended(qa, false));
    CHECK_OK(fq_queue_set_suspended(qb, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    check_cancelled(&run, "running g1 member");
    for (int i = 0; i < N; i++) {
        char what[32];
        snprintf(what, sizeof what, "op %d", i);
        if (in_g1[i]) {
            check_cancelled(&r[i], what);
            CHECK_EQ_INT(atomic_load(&r[i].body_runs), 0);
        } else {
            CHECK_EQ_INT(r[i].outcome, FQ_SUCCEEDED);
            CHECK_EQ_INT(atomic_load(&r[i].body_runs), 1);
        }
    }
    CHECK_EQ_INT(fq_cancel_group(e, "g1"), 0); /* all finished now */
    CHECK_EQ_INT(fq_cancel_group(e, "g2"), 0);
    CHECK_EQ_INT(fqt_stat(e, "cancelled", -1), 4);
    CHECK_EQ_INT(fqt_stat(e, "succeeded", -1), 4);
    rec_clear(&run);
    rec_clear_all(r, N);
    fqt_engine_free(e);
}

TEST(queue_and_engine_cancel_all) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    fq_queue *other = fqt_queue(e, "other", 2);
    rec run = {0}, p[3], o = {0};
    memset(p, 0, sizeof p);
    REQUIRE(fqt_async(q, body_async_capture, NULL, rec_done, &run) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&run.op) != NULL, FQT_LONG_MS));
    CHECK_OK(fq_queue_set_suspended(q, true));
    for (int i = 0; i < 3; i++) REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &p[i]) > 0);
    REQUIRE(fqt_block(other, body_tag, NULL, rec_done, &o) > 0);
    CHECK_EQ_INT(fq_queue_cancel_all(q), 4);
    CHECK_OK(fq_op_finish(atomic_load(&run.op), NULL, NULL));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    check_cancelled(&run, "running op of the queue");
    for (int i = 0; i < 3; i++) check_cancelled(&p[i], "pending op of the queue");
    CHECK_EQ_INT(o.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(fq_queue_cancel_all(q), 0);
    rec_clear(&run);
    rec_clear_all(p, 3);
    rec_clear(&o);

    /* engine-wide */
    CHECK_OK(fq_queue_set_suspended(other, true));
    rec s[5];
    memset(s, 0, sizeof s);
    for (int i = 0; i < 5; i++)
        REQUIRE(fqt_block(i % 2 ? q : other, body_tag, NULL, rec_done, &s[i]) > 0);
    CHECK_EQ_INT(fq_cancel_all(e), 5);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < 5; i++) check_cancelled(&s[i], "engine cancel_all");
    CHECK_EQ_INT(fq_cancel_all(e), 0);
    /* the queues still work afterwards */
    CHECK_OK(fq_queue_set_suspended(q, false));
    rec after = {0};
    REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &after) > 0);
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    CHECK_EQ_INT(after.outcome, FQ_SUCCEEDED);
    rec_clear_all(s, 5);
    rec_clear(&after);
    fqt_engine_free(e);
}

TEST(queue_free_cancels_pending_running_finish) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "doomed", 2);
    rec run = {0}, p[3];
    memset(p, 0, sizeof p);
    REQUIRE(fqt_async(q, body_async_capture, NULL, rec_done, &run) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&run.op) != NULL, FQT_LONG_MS));
    CHECK_OK(fq_queue_set_suspended(q, true));
    for (int i = 0; i < 3; i++) REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &p[i]) > 0);
    fq_queue_free(q); /* returns at once although an op still runs */
    for (int i = 0; i < 3; i++)
        CHECK(WAIT_UNTIL(atomic_load(&p[i].calls) == 1, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&run.calls), 0);
    CHECK(!fq_op_is_cancelled(atomic_load(&run.op)));
    CHECK_EQ_INT(fqt_finish_in_thread(atomic_load(&run.op), json_integer(5), NULL), FQ_OK);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(run.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(json_integer_value(run.value), 5);
    for (int i = 0; i < 3; i++) {
        check_cancelled(&p[i], "pending op of a freed queue");
        CHECK_EQ_INT(atomic_load(&p[i].body_runs), 0);
    }
    rec_clear(&run);
    rec_clear_all(p, 3);
    fqt_engine_free(e);
}

/* ------------------------------------------------------------ re-entrance */

/* `self` comes first: the body (body_tag) and rec_done see the userdata as a
 * rec. */
typedef struct {
    rec self;
    fq_engine *e;
    fq_queue *q, *paused;
    fq_op_id p1, p2;
    rec follow;
    atomic_llong follow_id;
    int rc_cancel, rc_prio, rc_wait_idle, rc_queue_wait, rc_dispatch, rc_free, rc_resume;
    bool stats_ok;
} reentry;

static void reentrant_done(const fq_result *res, void *userdata) {
    reentry *x = userdata;
    rec_done(res, &x->self);
    atomic_store(&x->follow_id, fqt_block(x->q, body_tag, NULL, rec_done, &x->follow));
    x->rc_cancel = fq_cancel(x->e, x->p1);
    x->rc_prio = fq_set_priority(x->e, x->p2, 4);
    json_t *s = fq_engine_stats(x->e);
    x->stats_ok = json_is_object(s);
    json_decref(s);
    x->rc_wait_idle = fq_engine_wait_idle(x->e, 0);
    x->rc_queue_wait = fq_queue_wait(x->q, 0);
    x->rc_dispatch = fq_engine_dispatch(x->e, 0);
    x->rc_free = fq_engine_free(x->e);
    x->rc_resume = fq_queue_set_suspended(x->paused, false);
}

TEST(reentrant_calls_from_a_callback) {
    reentry x;
    memset(&x, 0, sizeof x);
    x.e = fqt_engine(NULL);
    x.q = fqt_queue(x.e, "q", 2);
    x.paused = fqt_queue(x.e, "paused", 1);
    CHECK_OK(fq_queue_set_suspended(x.paused, true));
    rec p1 = {0}, p2 = {0};
    x.p1 = fqt_block(x.paused, body_tag, NULL, rec_done, &p1);
    x.p2 = fqt_block(x.paused, body_tag, NULL, rec_done, &p2);
    REQUIRE(x.p1 > 0 && x.p2 > 0);
    REQUIRE(fqt_block(x.q, body_tag, NULL, reentrant_done, &x) > 0);
    CHECK_OK(fq_engine_wait_idle(x.e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&x.self.calls), 1);
    CHECK(!pthread_equal(x.self.thread, pthread_self())); /* delivery thread */
    CHECK(atomic_load(&x.follow_id) > 0);
    CHECK_EQ_INT(atomic_load(&x.follow.calls), 1);
    CHECK_EQ_INT(x.follow.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(x.follow.id, atomic_load(&x.follow_id));
    CHECK_EQ_INT(x.rc_cancel, FQ_OK);
    CHECK_EQ_INT(x.rc_prio, FQ_OK);
    CHECK(x.stats_ok);
    CHECK_EQ_INT(x.rc_wait_idle, FQ_ERR_STATE);
    CHECK_EQ_INT(x.rc_queue_wait, FQ_ERR_STATE);
    CHECK_EQ_INT(x.rc_dispatch, FQ_ERR_STATE);
    CHECK_EQ_INT(x.rc_free, FQ_ERR_STATE);
    CHECK_EQ_INT(x.rc_resume, FQ_OK);
    check_cancelled(&p1, "op cancelled from a callback");
    CHECK_EQ_INT(atomic_load(&p1.body_runs), 0);
    CHECK_EQ_INT(p2.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(fqt_stat(x.e, "submitted", -1), 4);
    rec_clear(&x.self);
    rec_clear(&x.follow);
    rec_clear(&p1);
    rec_clear(&p2);
    fqt_engine_free(x.e); /* the engine is still usable and frees normally */
}

/* A chain: each callback submits the next operation until DEPTH. */
enum { CHAIN_DEPTH = 300 };
typedef struct {
    fq_queue *q;
    atomic_int calls;
    atomic_int submit_failures;
} chain;

static void chain_done(const fq_result *res, void *userdata) {
    chain *c = userdata;
    int n = atomic_fetch_add(&c->calls, 1) + 1;
    if (fq_result_outcome(res) != FQ_SUCCEEDED) atomic_fetch_add(&c->submit_failures, 1);
    if (n < CHAIN_DEPTH && fq_submit_block(c->q, body_noop, NULL, chain_done, c) <= 0)
        atomic_fetch_add(&c->submit_failures, 1);
}

TEST(chain_of_submits_from_callbacks) {
    fq_engine *e = fqt_engine(NULL);
    chain c = {.q = fqt_queue(e, "chain", 1)};
    REQUIRE(fq_submit_block(c.q, body_noop, NULL, chain_done, &c) > 0);
    /* wait_idle must cover work submitted by callbacks while it waits */
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&c.calls), CHAIN_DEPTH);
    CHECK_EQ_INT(atomic_load(&c.submit_failures), 0);
    CHECK_EQ_INT(fqt_stat(e, "submitted", -1), CHAIN_DEPTH);
    CHECK_EQ_INT(fqt_stat(e, "succeeded", -1), CHAIN_DEPTH);
    fqt_engine_free(e);
}

typedef struct {
    rec self; /* first: rec_done sees the userdata as a rec */
    fq_engine *e;
    fq_queue *q;
    fq_op_id victim;
    rec child;
    fq_op_id child_id;
    int rc_cancel, rc_wait, rc_qwait, rc_free;
} body_reentry;

static json_t *body_reenters(fq_op *op, void *userdata) {
    (void)op;
    body_reentry *b = userdata;
    b->child_id = fqt_block(b->q, body_tag, NULL, rec_done, &b->child);
    b->rc_cancel = fq_cancel(b->e, b->victim);
    b->rc_wait = fq_engine_wait_idle(b->e, 0);
    b->rc_qwait = fq_queue_wait(b->q, 0);
    b->rc_free = fq_engine_free(b->e);
    return NULL;
}

TEST(reentrant_calls_from_a_body) {
    body_reentry b;
    memset(&b, 0, sizeof b);
    b.e = fqt_engine(NULL);
    b.q = fqt_queue(b.e, "q", 2);
    fq_queue *paused = fqt_queue(b.e, "paused", 1);
    CHECK_OK(fq_queue_set_suspended(paused, true));
    rec v = {0};
    b.victim = fqt_block(paused, body_tag, NULL, rec_done, &v);
    REQUIRE(b.victim > 0);
    REQUIRE(fqt_block(b.q, body_reenters, NULL, rec_done, &b) > 0);
    CHECK_OK(fq_queue_wait(b.q, FQT_LONG_MS));
    CHECK_OK(fq_engine_wait_idle(b.e, FQT_LONG_MS));
    CHECK(b.child_id > 0);
    CHECK_EQ_INT(b.child.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(b.rc_cancel, FQ_OK);
    CHECK_EQ_INT(b.rc_wait, FQ_ERR_STATE);
    CHECK_EQ_INT(b.rc_qwait, FQ_ERR_STATE);
    CHECK_EQ_INT(b.rc_free, FQ_ERR_STATE);
    check_cancelled(&v, "op cancelled from a body");
    CHECK_EQ_INT(b.self.outcome, FQ_SUCCEEDED);
    rec_clear(&v);
    rec_clear(&b.self);
    rec_clear(&b.child);
    fqt_engine_free(b.e);
}

/* -------------------------------------------------------------- engine free */

typedef struct {
    atomic_int calls;
    int outcome;
    int status;
    pthread_t thread;
} slot;

static void slot_done(const fq_result *res, void *userdata) {
    slot *s = userdata;
    s->outcome = (int)fq_result_outcome(res);
    s->status = fq_result_status(res);
    s->thread = pthread_self();
    atomic_fetch_add(&s->calls, 1);
}

static bool is_cancel_status(int st) {
    return st == FQ_ERR_CANCELLED || st == FQ_ERR_SHUTDOWN || st == FQ_ERR_DEPENDENCY;
}

static void free_with_pending(const char *config, bool poll_mode) {
    enum { N = 10000 };
    slot *s = calloc(N, sizeof *s);
    REQUIRE(s);
    fq_engine *e = fqt_engine(config);
    fq_queue *q = fqt_queue(e, "pending", 4);
    fq_queue *q2 = fqt_queue(e, "pending2", 1);
    CHECK_OK(fq_queue_set_suspended(q, true));
    CHECK_OK(fq_queue_set_suspended(q2, true));
    fq_op_id prev = 0;
    int accepted = 0;
    for (int i = 0; i < N; i++) {
        fq_op_id id;
        if (i % 100 == 99 && prev > 0) { /* some dependents too */
            char opts[64];
            snprintf(opts, sizeof opts, "{\"depends_on\": [%lld]}", (long long)prev);
            id = fqt_block(q2, body_noop, opts, slot_done, &s[i]);
        } else if (i % 3 == 0) {
            id = fq_submit_async(q, body_async_finish_now, NULL, slot_done, &s[i]);
        } else {
            id = fq_submit_block(i % 2 ? q : q2, body_noop, NULL, slot_done, &s[i]);
        }
        if (id <= 0) {
            FAILF("submit %d failed: %lld (%s)", i, (long long)id, fq_last_error());
            break;
        }
        prev = id;
        accepted++;
    }
    CHECK_EQ_INT(accepted, N);
    CHECK_EQ_INT(fqt_stat(e, "queued", -1), N);
    fqt_engine_free(e);
    int missing = 0, extra = 0, wrong = 0, off_thread = 0;
    for (int i = 0; i < accepted; i++) {
        int c = atomic_load(&s[i].calls);
        if (c == 0) missing++;
        if (c > 1) extra++;
        if (c >= 1 && (s[i].outcome != FQ_CANCELLED || !is_cancel_status(s[i].status))) {
            if (wrong++ < 5)
                FAILF("op %d: outcome %d status %d (%s) after engine free", i, s[i].outcome,
                      s[i].status, fq_strerror(s[i].status));
        }
        if (poll_mode && c >= 1 && !pthread_equal(s[i].thread, pthread_self())) off_thread++;
    }
    CHECK_EQ_INT(missing, 0);
    CHECK_EQ_INT(extra, 0);
    CHECK_EQ_INT(wrong, 0);
    CHECK_EQ_INT(off_thread, 0);
    free(s);
}

TEST(engine_free_delivers_10000_pending) {
    free_with_pending(NULL, false);
}

TEST(engine_free_delivers_10000_pending_poll_mode) {
    free_with_pending("{\"delivery\": \"poll\"}", true);
}

typedef struct {
    rec *r;
    int rc;
    bool saw_cancel;
} canceller_watch;

/* Finishes an async op once it sees the engine cancel it. */
static void *finish_when_cancelled(void *p) {
    canceller_watch *w = p;
    REQUIRE(WAIT_UNTIL(atomic_load(&w->r->op) != NULL, FQT_LONG_MS));
    fq_op *op = atomic_load(&w->r->op);
    w->saw_cancel = WAIT_UNTIL(fq_op_is_cancelled(op), FQT_LONG_MS);
    w->rc = fq_op_finish(op, json_string("too late"), NULL);
    return NULL;
}

typedef struct {
    fq_queue *q;
    atomic_int attempts;
    atomic_int shutdown_rcs;
    atomic_int other_rcs;
    rec rejected;
    slot me;
} submitting_cb;

static void submit_during_free(const fq_result *res, void *userdata) {
    submitting_cb *c = userdata;
    slot_done(res, &c->me);
    fq_op_id id = fq_submit_block(c->q, body_tag, NULL, rec_done, &c->rejected);
    atomic_fetch_add(&c->attempts, 1);
    if (id == FQ_ERR_SHUTDOWN)
        atomic_fetch_add(&c->shutdown_rcs, 1);
    else
        atomic_fetch_add(&c->other_rcs, 1);
}

/* Finishes an async op at once, from its own thread, while fq_engine_free
 * runs on another: the callback may run and the free go on while this
 * thread is still in fq_op_finish (which then held no reference to the
 * engine; the ninth review). Under ASan or valgrind a use of the freed
 * engine shows. */
static void *finish_at_once(void *p) {
    rec *r = p;
    if (WAIT_UNTIL(atomic_load(&r->op) != NULL, FQT_LONG_MS))
        r->tag = fq_op_finish(atomic_load(&r->op), json_integer(7), NULL);
    return NULL;
}

TEST(engine_free_while_another_thread_finishes_an_async_op) {
    for (int round = 0; round < 60; round++) {
        fq_engine *e = fqt_engine(round % 3 == 1 ? "{\"delivery\": \"inline\"}"
                                  : round % 3 == 2 ? "{\"delivery\": \"poll\"}" : NULL);
        fq_queue *q = fqt_queue(e, "q", 1);
        rec r = {0};
        r.tag = 12345;
        REQUIRE(fqt_async(q, body_async_capture, NULL, rec_done, &r) > 0);
        REQUIRE(WAIT_UNTIL(atomic_load(&r.op) != NULL, FQT_LONG_MS));
        pthread_t t;
        REQUIRE(pthread_create(&t, NULL, finish_at_once, &r) == 0);
        fqt_engine_free(e);
        CHECK_EQ_INT(atomic_load(&r.calls), 1); /* delivered before the free returned */
        pthread_join(t, NULL);
        CHECK_EQ_INT(r.tag, FQ_OK);
        CHECK(r.outcome == FQ_SUCCEEDED || r.outcome == FQ_CANCELLED);
        rec_clear(&r);
    }
}

TEST(engine_free_waits_for_running_ops) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 4);
    fq_queue *paused = fqt_queue(e, "paused", 1);
    atomic_store(&g_release, 1);
    rec blk = {0}, asy = {0};
    REQUIRE(fqt_block(q, body_until_cancelled, NULL, rec_done, &blk) > 0);
    REQUIRE(fqt_async(q, body_async_capture, NULL, rec_done, &asy) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&blk.body_runs) == 1 && atomic_load(&asy.op) != NULL,
                       FQT_LONG_MS));
    CHECK_OK(fq_queue_set_suspended(paused, true));
    submitting_cb cb;
    memset(&cb, 0, sizeof cb);
    cb.q = q;
    REQUIRE(fqt_block(paused, body_noop, NULL, submit_during_free, &cb) > 0);

    canceller_watch w = {.r = &asy, .rc = 12345};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, finish_when_cancelled, &w) == 0);
    fqt_engine_free(e);
    /* everything was delivered before fq_engine_free returned */
    CHECK_EQ_INT(atomic_load(&blk.calls), 1);
    CHECK_EQ_INT(atomic_load(&asy.calls), 1);
    CHECK_EQ_INT(atomic_load(&cb.me.calls), 1);
    pthread_join(t, NULL);
    CHECK(w.saw_cancel);
    CHECK_EQ_INT(w.rc, FQ_OK);
    CHECK_EQ_INT(blk.tag, 1);
    CHECK_EQ_INT(blk.outcome, FQ_CANCELLED);
    CHECK_EQ_INT(asy.outcome, FQ_CANCELLED);
    CHECK_EQ_INT(cb.me.outcome, FQ_CANCELLED);
    CHECK_EQ_INT(atomic_load(&cb.attempts), 1);
    CHECK_EQ_INT(atomic_load(&cb.shutdown_rcs), 1);
    CHECK_EQ_INT(atomic_load(&cb.rejected.calls), 0);
    CHECK_EQ_INT(atomic_load(&cb.rejected.body_runs), 0);
    rec_clear(&blk);
    rec_clear(&asy);
}

static atomic_int g_free_rc_in_cb = 12345;
static void free_in_callback(const fq_result *res, void *userdata) {
    (void)res;
    atomic_store(&g_free_rc_in_cb, fq_engine_free((fq_engine *)userdata));
}

TEST(engine_free_from_callback_is_refused) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    REQUIRE(fq_submit_block(q, body_noop, NULL, free_in_callback, e) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&g_free_rc_in_cb), FQ_ERR_STATE);
    /* the engine still works */
    rec r = {0};
    REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &r) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(r.outcome, FQ_SUCCEEDED);
    rec_clear(&r);
    fqt_engine_free(e);

    /* the same in poll mode, from a callback run by fq_engine_dispatch */
    e = fqt_engine("{\"delivery\": \"poll\"}");
    q = fqt_queue(e, "q", 1);
    atomic_store(&g_free_rc_in_cb, 12345);
    REQUIRE(fq_submit_block(q, body_noop, NULL, free_in_callback, e) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&g_free_rc_in_cb), FQ_ERR_STATE);
    fqt_engine_free(e);
}
