/* Config "delivery": "inline": callbacks stay serialized, in completion
 * order and exactly once, but the worker that ended an operation runs the
 * callback itself when nothing else is being delivered. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "fqt.h"

/* One block operation on an idle engine: nothing else is delivering, so the
 * worker that ran the body runs the callback (inline), while in thread mode
 * the delivery thread does. */
static void one_op_callback_thread(const char *config, bool expect_same_thread) {
    fq_engine *e = fqt_engine(config);
    fq_queue *q = fqt_queue(e, "q", 1);
    rec r = {0};
    r.tag = 7;
    REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &r) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&r.calls), 1);
    CHECK_EQ_INT(r.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(fqt_int(r.value, "tag", -1), 7);
    CHECK(!pthread_equal(r.thread, pthread_self()));
    CHECK_EQ_INT(pthread_equal(r.thread, r.body_thread) != 0, expect_same_thread);
    rec_clear(&r);
    fqt_engine_free(e);
}

TEST(inline_callback_runs_on_the_worker_that_ended_the_op) {
    one_op_callback_thread("{\"delivery\": \"inline\"}", true);
}

TEST(thread_mode_callback_runs_on_the_delivery_thread) {
    one_op_callback_thread("{\"delivery\": \"thread\"}", false);
}

/* Many operations, some chained, some cancelled from this thread while they
 * run: every callback exactly once, never two at a time, a dependency's
 * callback before its dependent's; then one more on the idle engine runs its
 * callback on its body's worker (the engine is in inline mode). */
enum { MANY = 20000, CHAIN_EVERY = 10 };

typedef struct {
    atomic_int inside;      /* callbacks running now */
    atomic_int overlaps;    /* a callback found another one running */
    atomic_int calls[MANY];
    long done_seq[MANY];
    int outcome[MANY];
    fq_op_id ids[MANY];
    bool cancel_ok[MANY];   /* fq_cancel returned FQ_OK for it */
    atomic_int on_body_thread; /* callbacks that ran on their body's worker */
    pthread_t body_thread[MANY];
} many_state;

static many_state *many;

static json_t *many_body(fq_op *op, void *userdata) {
    (void)op;
    long i = (long)(intptr_t)userdata;
    many->body_thread[i] = pthread_self();
    return NULL;
}

static void many_done(const fq_result *res, void *userdata) {
    long i = (long)(intptr_t)userdata;
    if (atomic_fetch_add(&many->inside, 1) != 0) atomic_fetch_add(&many->overlaps, 1);
    atomic_fetch_add(&many->calls[i], 1);
    many->outcome[i] = fq_result_outcome(res);
    many->done_seq[i] = fqt_seq();
    if (many->outcome[i] == FQ_SUCCEEDED && pthread_equal(pthread_self(), many->body_thread[i]))
        atomic_fetch_add(&many->on_body_thread, 1);
    atomic_fetch_sub(&many->inside, 1);
}

TEST(inline_callbacks_serialized_ordered_exactly_once) {
    many = calloc(1, sizeof *many);
    REQUIRE(many != NULL);
    fq_engine *e = fqt_engine("{\"delivery\": \"inline\", \"workers\": 3}");
    fq_queue *q1 = fqt_queue(e, "q1", 2);
    fq_queue *q2 = fqt_queue(e, "q2", 3);
    char opts[64];
    unsigned seed = 12345;
    int cancelled_calls = 0;
    for (long i = 0; i < MANY; i++) {
        const char *o = NULL;
        if (i % CHAIN_EVERY == 1) {
            snprintf(opts, sizeof opts, "{\"depends_on\": [%lld]}", (long long)many->ids[i - 1]);
            o = opts;
        }
        many->ids[i] = fqt_block(i % 2 ? q1 : q2, many_body, o, many_done, (void *)(intptr_t)i);
        REQUIRE(many->ids[i] > 0);
        seed = seed * 1103515245u + 12345u;
        if ((seed >> 16) % 7 == 0) {
            long victim = (long)((seed >> 8) % (unsigned)(i + 1));
            if (fq_cancel(e, many->ids[victim]) == FQ_OK) many->cancel_ok[victim] = true;
        }
    }
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS * 3));
    int succeeded = 0, cancelled = 0, failed = 0, bad_calls = 0, misordered = 0, not_cancelled = 0;
    for (long i = 0; i < MANY; i++) {
        if (atomic_load(&many->calls[i]) != 1) bad_calls++;
        switch (many->outcome[i]) {
        case FQ_SUCCEEDED: succeeded++; break;
        case FQ_CANCELLED: cancelled++; break;
        case FQ_FAILED: failed++; break;
        }
        /* a dependent that ran (it may end first when it is cancelled itself) */
        if (i % CHAIN_EVERY == 1 && many->outcome[i] == FQ_SUCCEEDED && many->done_seq[i - 1] >= many->done_seq[i])
            misordered++;
        if (many->cancel_ok[i]) {
            cancelled_calls++;
            if (many->outcome[i] != FQ_CANCELLED) not_cancelled++;
        }
    }
    CHECK_EQ_INT(bad_calls, 0);
    CHECK_EQ_INT(atomic_load(&many->overlaps), 0);
    CHECK_EQ_INT(misordered, 0);
    CHECK_EQ_INT(succeeded + cancelled + failed, MANY);
    /* a cancel that returned FQ_OK always ends the op cancelled */
    CHECK_EQ_INT(not_cancelled, 0);
    CHECK(cancelled_calls > 0);
    CHECK(succeeded > MANY / 2);
    /* How many callbacks ran inline depends on the timing (under valgrind,
     * which runs one thread at a time, it can be none): a note. That this
     * engine is in inline mode is checked with one more operation on it, now
     * idle, which the worker that ran it must call back itself. */
    h_note("%d succeeded, %d cancelled (%d ops cancelled by a call), %d failed; %d callbacks on the body's worker",
           succeeded, cancelled, cancelled_calls, failed, atomic_load(&many->on_body_thread));
    rec last = {0};
    REQUIRE(fqt_block(q1, body_tag, NULL, rec_done, &last) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&last.calls), 1);
    CHECK(pthread_equal(last.thread, last.body_thread) != 0);
    rec_clear(&last);
    fqt_engine_free(e);
    free(many);
    many = NULL;
}

/* An operation that ends on another worker while an inline callback runs
 * finds that callback running: its own callback waits, and the thread that
 * is running callbacks runs it next (not the delivery thread, which nobody
 * wakes for it, nor the worker that ran its body). X's callback runs inline
 * on X's worker and returns only once Y has succeeded; Y's body, on the
 * other worker, ends only once X's callback has started. */
static struct {
    fq_engine *e;
    pthread_t x_body, y_body, x_callback, y_callback;
    atomic_int x_callback_started, x_calls, y_calls;
    atomic_int y_ended_during_x; /* X's callback saw Y succeed */
    atomic_int y_waited;         /* Y's body saw X's callback start */
    int y_outcome;
} drain;

static json_t *drain_x_body(fq_op *op, void *userdata) {
    (void)op, (void)userdata;
    drain.x_body = pthread_self();
    return NULL;
}

static json_t *drain_y_body(fq_op *op, void *userdata) {
    (void)op, (void)userdata;
    drain.y_body = pthread_self();
    atomic_store(&drain.y_waited, WAIT_UNTIL(atomic_load(&drain.x_callback_started), FQT_LONG_MS));
    return NULL;
}

static void drain_x_done(const fq_result *res, void *userdata) {
    (void)res, (void)userdata;
    drain.x_callback = pthread_self();
    atomic_fetch_add(&drain.x_calls, 1);
    atomic_store(&drain.x_callback_started, 1);
    /* "succeeded" counts Y under the engine lock that also posts its
     * completion: once it reads 2, Y's callback is waiting. */
    atomic_store(&drain.y_ended_during_x, WAIT_UNTIL(fqt_stat(drain.e, "succeeded", -1) >= 2, FQT_LONG_MS));
}

static void drain_y_done(const fq_result *res, void *userdata) {
    (void)userdata;
    drain.y_outcome = fq_result_outcome(res);
    drain.y_callback = pthread_self();
    atomic_fetch_add(&drain.y_calls, 1);
}

TEST(inline_thread_runs_callbacks_posted_meanwhile) {
    memset(&drain, 0, sizeof drain);
    drain.e = fqt_engine("{\"delivery\": \"inline\", \"workers\": 2}");
    fq_queue *q = fqt_queue(drain.e, "q", 2);
    REQUIRE(fqt_block(q, drain_x_body, NULL, drain_x_done, NULL) > 0);
    REQUIRE(fqt_block(q, drain_y_body, NULL, drain_y_done, NULL) > 0);
    CHECK_OK(fq_engine_wait_idle(drain.e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&drain.x_calls), 1);
    CHECK_EQ_INT(atomic_load(&drain.y_calls), 1);
    CHECK_EQ_INT(drain.y_outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(atomic_load(&drain.y_waited), 1);
    CHECK_EQ_INT(atomic_load(&drain.y_ended_during_x), 1);
    /* X's callback ran inline on X's worker; Y ran on the other worker */
    CHECK(pthread_equal(drain.x_callback, drain.x_body) != 0);
    CHECK(pthread_equal(drain.y_body, drain.x_body) == 0);
    /* Y's callback ran after X's, on the same thread */
    CHECK(pthread_equal(drain.y_callback, drain.x_body) != 0);
    fqt_engine_free(drain.e);
}

/* What an end unblocks starts on an idle worker while that end's callback
 * runs inline: B (depends on A) starts while A's callback still runs, which
 * waits for it. The worker that ended A kept B for itself and ran it after
 * the callback, however long, with the other worker idle (the sixth review). */
static struct {
    atomic_int b_started;
    atomic_int b_started_during_a_callback;
} unblock;

static json_t *unblock_a_body(fq_op *op, void *userdata) {
    (void)op, (void)userdata;
    return NULL;
}

static json_t *unblock_b_body(fq_op *op, void *userdata) {
    (void)op, (void)userdata;
    atomic_store(&unblock.b_started, 1);
    return NULL;
}

static void unblock_a_done(const fq_result *res, void *userdata) {
    (void)res, (void)userdata;
    atomic_store(&unblock.b_started_during_a_callback,
                 WAIT_UNTIL(atomic_load(&unblock.b_started), FQT_LONG_MS));
}

TEST(inline_callback_does_not_hold_back_what_its_end_unblocked) {
    memset(&unblock, 0, sizeof unblock);
    fq_engine *e = fqt_engine("{\"delivery\": \"inline\", \"workers\": 2}");
    fq_queue *q = fqt_queue(e, "q", 2);
    CHECK_OK(fq_queue_set_suspended(q, true));
    fq_op_id a = fqt_block(q, unblock_a_body, NULL, unblock_a_done, NULL);
    REQUIRE(a > 0);
    char opts[64];
    snprintf(opts, sizeof opts, "{\"depends_on\": [%lld]}", (long long)a);
    rec b = {0};
    REQUIRE(fqt_block(q, unblock_b_body, opts, rec_done, &b) > 0);
    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_OK(fq_engine_wait_idle(e, 2 * FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&unblock.b_started_during_a_callback), 1);
    CHECK_EQ_INT(b.outcome, FQ_SUCCEEDED);
    rec_clear(&b);
    fqt_engine_free(e);
}

/* Reentrant calls from an inline callback (it runs on a worker): the waits
 * and fq_engine_free refuse with FQ_ERR_STATE, submitting works. */
typedef struct {
    rec self; /* first: body_tag and rec_done see the userdata as a rec */
    rec follow;
    fq_engine *e;
    fq_queue *q;
    atomic_llong follow_id;
    int rc_wait_idle, rc_queue_wait, rc_free, rc_dispatch;
} reentry;

static void reentrant_done(const fq_result *res, void *userdata) {
    reentry *x = userdata;
    rec_done(res, &x->self);
    atomic_store(&x->follow_id, fqt_block(x->q, body_tag, NULL, rec_done, &x->follow));
    x->rc_wait_idle = fq_engine_wait_idle(x->e, 0);
    x->rc_queue_wait = fq_queue_wait(x->q, 0);
    x->rc_dispatch = fq_engine_dispatch(x->e, 0);
    x->rc_free = fq_engine_free(x->e);
}

TEST(inline_callback_reentrant_calls) {
    reentry x;
    memset(&x, 0, sizeof x);
    x.e = fqt_engine("{\"delivery\": \"inline\"}");
    x.q = fqt_queue(x.e, "q", 1);
    REQUIRE(fqt_block(x.q, body_tag, NULL, reentrant_done, &x) > 0);
    CHECK_OK(fq_engine_wait_idle(x.e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&x.self.calls), 1);
    CHECK(pthread_equal(x.self.thread, x.self.body_thread));
    CHECK(atomic_load(&x.follow_id) > 0);
    CHECK_EQ_INT(atomic_load(&x.follow.calls), 1);
    CHECK_EQ_INT(x.follow.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(x.rc_wait_idle, FQ_ERR_STATE);
    CHECK_EQ_INT(x.rc_queue_wait, FQ_ERR_STATE);
    CHECK_EQ_INT(x.rc_dispatch, FQ_ERR_STATE);
    CHECK_EQ_INT(x.rc_free, FQ_ERR_STATE);
    CHECK_EQ_INT(fq_engine_event_fd(x.e), FQ_ERR_INVALID);
    rec_clear(&x.self);
    rec_clear(&x.follow);
    fqt_engine_free(x.e);
}

/* Requests and searches in inline mode: parsed values arrive, each exactly
 * once, and an engine freed with requests pending delivers them all. */
TEST(inline_mode_requests_and_free_with_pending) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    char url[256];
    enum { NR = 200 };
    netrec *n = calloc(NR, sizeof *n);
    REQUIRE(n != NULL);
    fq_engine *e = fqt_engine("{\"delivery\": \"inline\", \"max_per_host\": 8}");
    fq_queue *q = fqt_queue(e, "q", 8);
    for (int i = 0; i < NR; i++) {
        char path[64];
        snprintf(path, sizeof path, "/echo?i=%d", i);
        json_t *req = json_pack("{s:s}", "url", fqt_url(&s, path, url, sizeof url));
        REQUIRE(req != NULL);
        CHECK(fq_submit_request(q, req, NULL, net_done, &n[i]) > 0);
        json_decref(req);
    }
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    int ok = 0;
    for (int i = 0; i < NR; i++) {
        CHECK_EQ_INT(atomic_load(&n[i].r.calls), 1);
        char want[32];
        snprintf(want, sizeof want, "%d", i);
        json_t *query = json_object_get(n[i].r.value, "query");
        if (n[i].r.outcome == FQ_SUCCEEDED && n[i].http_status == 200 &&
            json_is_string(json_object_get(query, "i")) &&
            strcmp(json_string_value(json_object_get(query, "i")), want) == 0)
            ok++;
    }
    CHECK_EQ_INT(ok, NR);
    for (int i = 0; i < NR; i++) netrec_clear(&n[i]);
    memset(n, 0, NR * sizeof *n);
    /* freed with everything pending: every callback still runs once */
    for (int i = 0; i < NR; i++) {
        json_t *req = json_pack("{s:s}", "url", fqt_url(&s, "/echo", url, sizeof url));
        CHECK(fq_submit_request(q, req, NULL, net_done, &n[i]) > 0);
        json_decref(req);
    }
    fqt_engine_free(e);
    int once = 0;
    for (int i = 0; i < NR; i++) once += atomic_load(&n[i].r.calls) == 1;
    CHECK_EQ_INT(once, NR);
    for (int i = 0; i < NR; i++) netrec_clear(&n[i]);
    free(n);
    fqt_server_stop(&s);
}

/* ------------------------------------------------------------------ */
/* fq_wait: one operation's end and its callback                        */
/* ------------------------------------------------------------------ */

enum { WAIT_OPS = 240, WAIT_THREADS = 4 };

/* Per operation: set by its callback as the callback's last step, after a
 * pause for the first ones (so that a wait returning before the callback
 * returned would see 0). */
static struct {
    atomic_int returned[WAIT_OPS];
    fq_op_id ids[WAIT_OPS];
    fq_engine *engine;
    atomic_int early;    /* waits that returned before the callback did */
    atomic_int waited;   /* waits that returned FQ_OK */
    atomic_int state_rc; /* fq_wait from a callback */
} wt;

static json_t *wait_body(fq_op *op, void *userdata) {
    (void)op;
    if ((intptr_t)userdata % 7 == 0) fqt_sleep_ms(2); /* some take longer */
    return NULL;
}

static void wait_done(const fq_result *res, void *userdata) {
    intptr_t i = (intptr_t)userdata;
    if (i < 8) fqt_sleep_ms(20);
    if (i == 0) atomic_store(&wt.state_rc, fq_wait(wt.engine, fq_result_op_id(res), 0));
    atomic_store(&wt.returned[i], 1);
}

/* Each thread waits for every WAIT_THREADS-th operation, newest first (most
 * of them still queued or running when it starts). */
static void *waiter_thread(void *arg) {
    intptr_t t = (intptr_t)arg;
    for (int i = WAIT_OPS - 1 - (int)t; i >= 0; i -= WAIT_THREADS) {
        int rc = fq_wait(wt.engine, wt.ids[i], FQT_LONG_MS);
        if (rc != FQ_OK) {
            FAILF("fq_wait(op %d) = %d: %s", i, rc, fq_last_error());
            continue;
        }
        atomic_fetch_add(&wt.waited, 1);
        if (!atomic_load(&wt.returned[i])) atomic_fetch_add(&wt.early, 1);
    }
    return NULL;
}

/* In every delivery mode, with four threads waiting at once while the
 * operations run (in poll mode the waits run the callbacks themselves). */
static void waits_return_after_the_callback(const char *config) {
    memset(&wt, 0, sizeof wt);
    wt.engine = fqt_engine(config);
    fq_queue *q = fqt_queue(wt.engine, "q", 2);
    CHECK_OK(fq_queue_set_suspended(q, true));
    for (intptr_t i = 0; i < WAIT_OPS; i++) {
        wt.ids[i] = fq_submit_block(q, wait_body, NULL, wait_done, (void *)i);
        REQUIRE(wt.ids[i] > 0);
    }
    pthread_t th[WAIT_THREADS];
    for (intptr_t t = 0; t < WAIT_THREADS; t++) REQUIRE(pthread_create(&th[t], NULL, waiter_thread, (void *)t) == 0);
    fqt_sleep_ms(20); /* the waits start while everything is queued */
    CHECK_OK(fq_queue_set_suspended(q, false));
    for (int t = 0; t < WAIT_THREADS; t++) pthread_join(th[t], NULL);
    CHECK_EQ_INT(atomic_load(&wt.waited), WAIT_OPS);
    CHECK_EQ_INT(atomic_load(&wt.early), 0);
    CHECK_EQ_INT(atomic_load(&wt.state_rc), FQ_ERR_STATE);
    /* Ended and delivered: a wait that may not wait at all succeeds. */
    CHECK_OK(fq_wait(wt.engine, wt.ids[WAIT_OPS - 1], 0));
    fq_queue_free(q);
    fqt_engine_free(wt.engine);
}

TEST(fq_wait_returns_after_the_callback_thread_mode) { waits_return_after_the_callback(NULL); }
TEST(fq_wait_returns_after_the_callback_inline_mode) { waits_return_after_the_callback("{\"delivery\": \"inline\"}"); }
TEST(fq_wait_returns_after_the_callback_poll_mode) { waits_return_after_the_callback("{\"delivery\": \"poll\"}"); }

static json_t *wait_in_body(fq_op *op, void *userdata) {
    rec *r = userdata;
    atomic_fetch_add(&r->body_runs, 1);
    r->tag = fq_wait(r->user, fq_op_get_id(op), 0);
    return NULL;
}

TEST(fq_wait_timeouts_and_errors) {
    fq_engine *e = fqt_engine("{\"history\": 2}");
    fq_queue *q = fqt_queue(e, "q", 1);
    rec a = {0}, s = {0}, b = {0};
    fq_op_id ida = fqt_async(q, body_async_capture, NULL, rec_done, &a);
    REQUIRE(ida > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&a.op) != NULL, FQT_LONG_MS));
    /* Running: times out, with a message naming it. */
    CHECK_EQ_INT(fq_wait(e, ida, 50), FQ_ERR_TIMEOUT);
    CHECK(fqt_names_id(fq_last_error(), ida));
    CHECK_EQ_INT(atomic_load(&a.calls), 0);
    CHECK_OK(fqt_finish_in_thread(atomic_load(&a.op), NULL, NULL));
    CHECK_OK(fq_wait(e, ida, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&a.calls), 1);
    /* A suspended queue's operation: waited for until the timeout. */
    fq_queue *held = fqt_queue(e, "held", 1);
    CHECK_OK(fq_queue_set_suspended(held, true));
    fq_op_id ids = fqt_block(held, body_tag, NULL, rec_done, &s);
    REQUIRE(ids > 0);
    CHECK_EQ_INT(fq_wait(e, ids, 30), FQ_ERR_TIMEOUT);
    CHECK_OK(fq_queue_set_suspended(held, false));
    CHECK_OK(fq_wait(e, ids, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&s.calls), 1);
    /* From its own body: FQ_ERR_STATE. */
    b.user = e;
    fq_op_id idb = fqt_block(q, wait_in_body, NULL, rec_done, &b);
    REQUIRE(idb > 0);
    CHECK_OK(fq_wait(e, idb, FQT_LONG_MS));
    CHECK_EQ_INT(b.tag, FQ_ERR_STATE);
    /* history 2: a, s, b ended; a is forgotten. */
    CHECK_EQ_INT(fq_wait(e, ida, 0), FQ_ERR_NOT_FOUND);
    CHECK_EQ_INT(fq_wait(e, 987654321, 0), FQ_ERR_NOT_FOUND);
    CHECK_EQ_INT(fq_wait(NULL, ida, 0), FQ_ERR_INVALID);
    rec_clear(&a);
    rec_clear(&s);
    rec_clear(&b);
    fq_queue_free(held);
    fq_queue_free(q);
    fqt_engine_free(e);
}

/* fq_wait on an operation known at the call and let go by history before
 * its callback returned ("history": 0); and on one whose callback returned
 * while a later operation's callback still runs: FQ_OK, at once. */
static struct {
    atomic_int y_running, release_y, a_returned, w_running, release_w;
} wl;

static void w_done_blocks(const fq_result *res, void *userdata) {
    (void)res;
    (void)userdata;
    atomic_store(&wl.w_running, 1);
    for (int i = 0; i < 20000 && !atomic_load(&wl.release_w); i++) fqt_sleep_ms(1);
}

static void a_done_slow(const fq_result *res, void *userdata) {
    (void)res;
    (void)userdata;
    fqt_sleep_ms(50);
    atomic_store(&wl.a_returned, 1);
}

static void y_done_blocks(const fq_result *res, void *userdata) {
    (void)res;
    (void)userdata;
    atomic_store(&wl.y_running, 1);
    for (int i = 0; i < 20000 && !atomic_load(&wl.release_y); i++) fqt_sleep_ms(1);
}

static void *dispatch_all(void *arg) { /* poll mode: runs Y's callback */
    fq_engine *e = arg;
    for (int i = 0; i < 20000 && !atomic_load(&wl.y_running); i++) {
        fq_engine_dispatch(e, 0);
        fqt_sleep_ms(1);
    }
    return NULL;
}

static void *finish_later(void *op) {
    fqt_sleep_ms(100);
    CHECK_OK(fq_op_finish(op, NULL, NULL));
    return NULL;
}

/* X's callback returned and Y's runs until release_y: a wait for X that
 * waited for Y's callback too would time out. Then lets Y go and frees. */
static void x_returns_while_y_runs(fq_engine *e, fq_queue *q, fq_op_id idx, fq_op_id idy, rec *x,
                                   pthread_t *dispatcher) {
    CHECK_OK(fq_wait(e, idx, 1000));
    CHECK_EQ_INT(atomic_load(&wl.release_y), 0); /* Y's callback still runs */
    atomic_store(&wl.release_y, 1);
    if (dispatcher) pthread_join(*dispatcher, NULL);
    CHECK_OK(fq_wait(e, idy, FQT_LONG_MS));
    rec_clear(x);
    fq_queue_free(q);
    fqt_engine_free(e);
}

static void waits_for_forgotten_and_earlier(const char *config, bool poll) {
    memset(&wl, 0, sizeof wl);
    fq_engine *e = fqt_engine(config);
    fq_queue *q = fqt_queue(e, "q", 1);
    rec a = {0};
    fq_op_id ida = fq_submit_async(q, body_async_capture, NULL, a_done_slow, &a);
    REQUIRE(ida > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&a.op) != NULL, FQT_LONG_MS));
    CHECK_EQ_INT(fq_state(e, ida), FQ_STATE_RUNNING);
    pthread_t finisher;
    REQUIRE(pthread_create(&finisher, NULL, finish_later, atomic_load(&a.op)) == 0);
    /* history 0: A, known at the call, is let go as it ends, before its
     * callback returns */
    CHECK_OK(fq_wait(e, ida, FQT_LONG_MS));
    pthread_join(finisher, NULL);
    CHECK_EQ_INT(atomic_load(&wl.a_returned), 1);
    CHECK_EQ_INT(fq_state(e, ida), FQ_ERR_NOT_FOUND);
    fq_queue_free(q);
    fqt_engine_free(e);

    /* X's callback returned; Y's (after it) runs on: X's wait does not wait for it. */
    e = fqt_engine(poll ? "{\"delivery\": \"poll\"}" : NULL);
    q = fqt_queue(e, "q", 1);
    rec x = {0};
    fq_op_id idx = fqt_block(q, body_tag, NULL, rec_done, &x);
    REQUIRE(idx > 0);
    CHECK_OK(fq_wait(e, idx, FQT_LONG_MS));
    fq_op_id idy = fq_submit_block(q, body_noop, NULL, y_done_blocks, NULL);
    REQUIRE(idy > 0);
    pthread_t th;
    if (poll) REQUIRE(pthread_create(&th, NULL, dispatch_all, e) == 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&wl.y_running), FQT_LONG_MS));
    x_returns_while_y_runs(e, q, idx, idy, &x, poll ? &th : NULL);

    /* X and Y end while W's callback runs, so that their callbacks are
     * delivered in one batch: X's returned, Y's runs on; X's wait does not
     * wait for Y's either. (It did: the batch was booked once, after Y's
     * callback, and this wait timed out.) */
    atomic_store(&wl.y_running, 0);
    atomic_store(&wl.release_y, 0);
    e = fqt_engine(poll ? "{\"delivery\": \"poll\"}" : strstr(config, "inline") ? "{\"delivery\": \"inline\"}" : NULL);
    q = fqt_queue(e, "q", 1);
    memset(&x, 0, sizeof x);
    if (poll) REQUIRE(pthread_create(&th, NULL, dispatch_all, e) == 0);
    REQUIRE(fq_submit_block(q, body_noop, NULL, w_done_blocks, NULL) > 0);
    idx = fqt_block(q, body_tag, NULL, rec_done, &x);
    REQUIRE(idx > 0);
    idy = fq_submit_block(q, body_noop, NULL, y_done_blocks, NULL);
    REQUIRE(idy > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&wl.w_running), FQT_LONG_MS));
    REQUIRE(WAIT_UNTIL(fq_state(e, idy) == FQ_STATE_SUCCEEDED, FQT_LONG_MS));
    CHECK_EQ_INT(fq_state(e, idx), FQ_STATE_SUCCEEDED);
    atomic_store(&wl.release_w, 1);
    REQUIRE(WAIT_UNTIL(atomic_load(&wl.y_running), FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&x.calls), 1);
    x_returns_while_y_runs(e, q, idx, idy, &x, poll ? &th : NULL);
}

TEST(fq_wait_forgotten_and_earlier_thread_mode) { waits_for_forgotten_and_earlier("{\"history\": 0}", false); }
TEST(fq_wait_forgotten_and_earlier_inline_mode) {
    waits_for_forgotten_and_earlier("{\"history\": 0, \"delivery\": \"inline\"}", false);
}
TEST(fq_wait_forgotten_and_earlier_poll_mode) {
    waits_for_forgotten_and_earlier("{\"history\": 0, \"delivery\": \"poll\"}", true);
}

/* Poll mode with the event fd registered edge-triggered (EPOLLET) and
 * dispatch limited by `max`: the completions a dispatch leaves waiting get a
 * new edge, so each wake-up is followed by the next until all have run; then
 * the fd is no longer readable. (Before, the fd was written only when the
 * first completion arrived: 3 of 10 callbacks ran, then epoll_wait timed out
 * with 7 waiting.) */
static long long undelivered(fq_engine *e) {
    json_t *stats = fq_engine_stats(e);
    long long n = fqt_int(stats, "undelivered", -1);
    json_decref(stats);
    return n;
}

TEST(poll_mode_edge_triggered_dispatch_with_max) {
    fq_engine *e = fqt_engine("{\"delivery\": \"poll\"}");
    fq_queue *q = fqt_queue(e, "q", 4);
    rec r[10];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 10; i++) REQUIRE(fqt_block(q, body_noop, NULL, rec_done, &r[i]) > 0);
    REQUIRE(WAIT_UNTIL(undelivered(e) == 10, FQT_LONG_MS)); /* all waiting before the first edge */
    int fd = fq_engine_event_fd(e);
    int ep = epoll_create1(0);
    REQUIRE(ep >= 0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.fd = fd};
    REQUIRE(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
    int ran[8], wakes = 0, total = 0;
    while (total < 10 && wakes < 8) {
        struct epoll_event out;
        if (epoll_wait(ep, &out, 1, h_scaled_ms(2000)) != 1) break; /* no edge: the defect */
        ran[wakes] = fq_engine_dispatch(e, 3);
        total += ran[wakes] > 0 ? ran[wakes] : 0;
        wakes++;
    }
    CHECK_EQ_INT(total, 10);
    CHECK_EQ_INT(wakes, 4);
    if (wakes == 4) {
        CHECK_EQ_INT(ran[0], 3);
        CHECK_EQ_INT(ran[1], 3);
        CHECK_EQ_INT(ran[2], 3);
        CHECK_EQ_INT(ran[3], 1);
    }
    for (int i = 0; i < 10; i++) CHECK_EQ_INT(atomic_load(&r[i].calls), 1);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    CHECK_EQ_INT(poll(&pfd, 1, 0), 0); /* nothing waits: not readable */
    struct epoll_event out;
    CHECK_EQ_INT(epoll_wait(ep, &out, 1, 0), 0);
    close(ep);
    rec_clear_all(r, 10);
    fqt_engine_free(e);
}
