/* Behaviours the suites did not pin down, found by mutation testing of the
 * engine core (docs/reliability.md, the eleventh review). Each names the
 * mutant it kills; gap_bulk_cancel_with_an_added_dependency_on_a_newer_op
 * found a defect of the code itself. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fqt.h"

/* S10: a bulk cancel counts an operation once: a running operation whose
 * cancel was already requested is not counted again. */
TEST(gap_bulk_cancel_counts_a_running_op_once) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    rec a = {0}, b = {0};
    REQUIRE(fqt_async(q, body_async_capture, "{\"group\": \"g\"}", rec_done, &a) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&a.op) != NULL, FQT_LONG_MS));
    CHECK_EQ_INT(fq_cancel_group(e, "g"), 1);
    CHECK_EQ_INT(fq_cancel_group(e, "g"), 0);
    CHECK_EQ_INT(fq_queue_cancel_all(q), 0);
    CHECK_EQ_INT(fq_cancel_all(e), 0);
    CHECK_OK(fq_op_finish(atomic_load(&a.op), NULL, NULL));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(a.outcome, FQ_CANCELLED);
    /* the same through fq_cancel_all and fq_queue_cancel_all */
    REQUIRE(fqt_async(q, body_async_capture, NULL, rec_done, &b) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&b.op) != NULL, FQT_LONG_MS));
    CHECK_EQ_INT(fq_queue_cancel_all(q), 1);
    CHECK_EQ_INT(fq_queue_cancel_all(q), 0);
    CHECK_EQ_INT(fq_cancel_all(e), 0);
    CHECK_OK(fq_op_finish(atomic_load(&b.op), NULL, NULL));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    rec_clear(&a);
    rec_clear(&b);
    fqt_engine_free(e);
}

/* S11, S33, S70: an operation cancelled by a bulk cancel together with its
 * dependency was cancelled by a cancel (FQ_ERR_CANCELLED, and fq_cancel on it
 * again is FQ_OK as the header promises), not by its dependency. */
static void bulk_case(int how) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q1 = fqt_queue(e, "q1", 1);
    fq_queue *q2 = fqt_queue(e, "q2", 1);
    CHECK_OK(fq_queue_set_suspended(q1, true));
    CHECK_OK(fq_queue_set_suspended(q2, true));
    enum { N = 8 };
    rec dep[N], dnt[N];
    memset(dep, 0, sizeof dep);
    memset(dnt, 0, sizeof dnt);
    fq_queue *dq = how == 2 ? q2 : q1; /* how 2: the dependency in the newer queue */
    for (int i = 0; i < N; i++) {
        fq_op_id a = fqt_block(dq, body_tag, "{\"group\": \"g\"}", rec_done, &dep[i]);
        REQUIRE(a > 0);
        char o[96];
        snprintf(o, sizeof o, "{\"group\": \"g\", \"depends_on\": [%lld]}", (long long)a);
        REQUIRE(fqt_block(q1, body_tag, o, rec_done, &dnt[i]) > 0);
    }
    int n = how == 0 ? fq_queue_cancel_all(q1) : how == 3 ? fq_cancel_group(e, "g") : fq_cancel_all(e);
    CHECK_EQ_INT(n, 2 * N);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    int dependency_status = 0;
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(dnt[i].outcome, FQ_CANCELLED);
        if (dnt[i].status != FQ_ERR_CANCELLED) dependency_status++;
        CHECK_EQ_INT(fq_cancel(e, dnt[i].id), FQ_OK); /* cancelled by a cancel: twice is harmless */
    }
    if (dependency_status) FAILF("how %d: %d of %d dependents report their dependency, not their own cancel", how, dependency_status, N);
    rec_clear_all(dep, N);
    rec_clear_all(dnt, N);
    fqt_engine_free(e);
}
TEST(gap_bulk_cancel_dependents_report_their_own_cancel) {
    bulk_case(0); /* fq_queue_cancel_all */
    bulk_case(1); /* fq_cancel_all, both in q1 (q2 empty) */
    bulk_case(2); /* fq_cancel_all across queues, dependency in the newer queue */
    bulk_case(3); /* fq_cancel_group */
}

/* S27: "max_wait_ms" counts the time waiting for dependencies too (fetchq.h:
 * "from the submit (waiting for dependencies included) to the start"). */
TEST(gap_max_wait_ms_applies_while_waiting_for_a_dependency) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 4);
    rec hold = {0}, w = {0}, bar = {0}, after = {0};
    fq_op_id h = fqt_async(q, body_async_capture, NULL, rec_done, &hold);
    REQUIRE(h > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&hold.op) != NULL, FQT_LONG_MS));
    char o[96];
    snprintf(o, sizeof o, "{\"depends_on\": [%lld], \"max_wait_ms\": 50}", (long long)h);
    REQUIRE(fqt_block(q, body_tag, o, rec_done, &w) > 0);
    /* and one held back by a barrier */
    REQUIRE(fqt_block(q, body_tag, "{\"barrier\": true}", rec_done, &bar) > 0);
    REQUIRE(fqt_block(q, body_tag, "{\"max_wait_ms\": 50}", rec_done, &after) > 0);
    CHECK(WAIT_UNTIL(atomic_load(&w.calls) == 1 && atomic_load(&after.calls) == 1, 5000));
    CHECK_EQ_INT(w.outcome, FQ_FAILED);
    CHECK_EQ_INT(w.status, FQ_ERR_QUEUE_TIMEOUT);
    CHECK_EQ_INT(after.outcome, FQ_FAILED);
    CHECK_EQ_INT(after.status, FQ_ERR_QUEUE_TIMEOUT);
    CHECK_OK(fq_op_finish(atomic_load(&hold.op), NULL, NULL));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    rec_clear(&hold); rec_clear(&w); rec_clear(&bar); rec_clear(&after);
    fqt_engine_free(e);
}

/* E07: inline mode keeps completion order when a completion waits for the
 * delivery thread: A (async, finished from this thread, so its callback is
 * handed to the delivery thread) ends before B (which depends on A and ends
 * on a worker, which may run callbacks inline): A's callback runs first. */
TEST(gap_inline_mode_keeps_order_behind_a_queued_callback) {
    fq_engine *e = fqt_engine("{\"delivery\": \"inline\", \"workers\": 2}");
    fq_queue *q = fqt_queue(e, "q", 2);
    enum { ROUNDS = 400 };
    int misordered = 0;
    for (int i = 0; i < ROUNDS; i++) {
        rec a = {0}, b = {0};
        fq_op_id ia = fqt_async(q, body_async_capture, NULL, rec_done, &a);
        REQUIRE(ia > 0);
        REQUIRE(WAIT_UNTIL(atomic_load(&a.op) != NULL, FQT_LONG_MS));
        char o[64];
        snprintf(o, sizeof o, "{\"depends_on\": [%lld]}", (long long)ia);
        fq_op_id ib = fqt_block(q, body_noop, o, rec_done, &b);
        REQUIRE(ib > 0);
        CHECK_OK(fq_op_finish(atomic_load(&a.op), NULL, NULL));
        CHECK_OK(fq_wait(e, ib, FQT_LONG_MS));
        CHECK_OK(fq_wait(e, ia, FQT_LONG_MS));
        if (!(a.done_seq < b.done_seq)) misordered++;
        rec_clear(&a);
        rec_clear(&b);
    }
    if (misordered) FAILF("%d of %d rounds: the dependent's callback ran before its dependency's", misordered, ROUNDS);
    fqt_engine_free(e);
}

/* E08: when queues compete for worker threads, higher QoS goes first. */
static atomic_int gate_open;
static json_t *body_hold(fq_op *op, void *userdata) {
    (void)op, (void)userdata;
    while (!atomic_load(&gate_open)) fqt_sleep_ms(1);
    return NULL;
}
TEST(gap_workers_take_higher_qos_first) {
    atomic_store(&gate_open, 0);
    fq_engine *e = fqt_engine("{\"workers\": 1}");
    fq_queue *bg = fqt_queue(e, "bg", 8);
    fq_queue *ui = fqt_queue(e, "ui", 8);
    rec hold = {0}, low[4], hi = {0};
    memset(low, 0, sizeof low);
    REQUIRE(fqt_block(bg, body_hold, NULL, rec_done, &hold) > 0);
    REQUIRE(WAIT_UNTIL(fqt_stat(e, "running", -1) == 1, FQT_LONG_MS));
    for (int i = 0; i < 4; i++) REQUIRE(fqt_block(bg, body_tag, "{\"qos\": \"background\"}", rec_done, &low[i]) > 0);
    REQUIRE(fqt_block(ui, body_tag, "{\"qos\": \"user-interactive\"}", rec_done, &hi) > 0);
    atomic_store(&gate_open, 1);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < 4; i++)
        if (!(atomic_load(&hi.start_seq) < atomic_load(&low[i].start_seq)))
            FAILF("a background op (%d) started before the user-interactive one", i);
    rec_clear(&hold); rec_clear_all(low, 4); rec_clear(&hi);
    fqt_engine_free(e);
}

/* S39: fq_add_dependency on a dependency that already succeeded passes its
 * result, "as in depends_on". */
static json_t *body_has_dep(fq_op *op, void *userdata) {
    rec *r = userdata;
    atomic_fetch_add(&r->body_runs, 1);
    r->tag = fq_op_dependency_result(op, r->dep) != NULL;
    return NULL;
}
TEST(gap_add_dependency_on_a_finished_op_passes_its_result) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    rec a = {0}, b = {0};
    fq_op_id ia = fqt_block(q, body_tag, NULL, rec_done, &a);
    REQUIRE(ia > 0);
    CHECK_OK(fq_wait(e, ia, FQT_LONG_MS));
    CHECK_OK(fq_queue_set_suspended(q, true));
    b.dep = ia;
    fq_op_id ib = fqt_block(q, body_has_dep, NULL, rec_done, &b);
    REQUIRE(ib > 0);
    CHECK_OK(fq_add_dependency(e, ib, ia));
    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_OK(fq_wait(e, ib, FQT_LONG_MS));
    CHECK_EQ_INT(b.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(b.tag, 1);
    rec_clear(&a); rec_clear(&b);
    fqt_engine_free(e);
}

/* S40, S41, S69: a dependency given twice counts once, so one
 * fq_remove_dependency lets the operation go (fetchq.h: "An id may appear
 * more than once (it counts once)"). Given twice by fq_add_dependency, by
 * "depends_on" on the locked path (the first dependent submit), and by
 * "depends_on" through the inbox (later ones). */
TEST(gap_a_dependency_given_twice_is_removed_once) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *hq = fqt_queue(e, "hold", 1);
    fq_queue *q = fqt_queue(e, "q", 4);
    CHECK_OK(fq_queue_set_suspended(q, true));
    rec hold = {0}, b[3];
    memset(b, 0, sizeof b);
    fq_op_id h = fqt_async(hq, body_async_capture, NULL, rec_done, &hold);
    REQUIRE(h > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&hold.op) != NULL, FQT_LONG_MS));
    char o[96];
    snprintf(o, sizeof o, "{\"depends_on\": [%lld, %lld]}", (long long)h, (long long)h);
    fq_op_id ids[3];
    ids[0] = fqt_block(q, body_tag, o, rec_done, &b[0]); /* opens the gate */
    ids[1] = fqt_block(q, body_tag, o, rec_done, &b[1]); /* through the inbox */
    ids[2] = fqt_block(q, body_tag, NULL, rec_done, &b[2]);
    for (int i = 0; i < 3; i++) REQUIRE(ids[i] > 0);
    CHECK_OK(fq_add_dependency(e, ids[2], h));
    CHECK_OK(fq_add_dependency(e, ids[2], h));
    for (int i = 0; i < 3; i++) CHECK_OK(fq_remove_dependency(e, ids[i], h));
    CHECK_OK(fq_queue_set_suspended(q, false));
    for (int i = 0; i < 3; i++) {
        if (!WAIT_UNTIL(atomic_load(&b[i].calls) == 1, 3000))
            FAILF("op %d still waits for the dependency removed from it", i);
        else
            CHECK_EQ_INT(b[i].outcome, FQ_SUCCEEDED);
    }
    CHECK_OK(fq_op_finish(atomic_load(&hold.op), NULL, NULL));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    rec_clear(&hold); rec_clear_all(b, 3);
    fqt_engine_free(e);
}

/* E16: in poll mode the event fd is readable once completions wait, also
 * when a bulk cancel posts several at once. */
TEST(gap_poll_fd_readable_after_a_bulk_cancel) {
    fq_engine *e = fqt_engine("{\"delivery\": \"poll\"}");
    fq_queue *q = fqt_queue(e, "q", 1);
    CHECK_OK(fq_queue_set_suspended(q, true));
    rec r[3];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 3; i++) REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &r[i]) > 0);
    CHECK_EQ_INT(fq_queue_cancel_all(q), 3);
    struct pollfd p = {.fd = fq_engine_event_fd(e), .events = POLLIN};
    CHECK_EQ_INT(poll(&p, 1, 1000), 1);
    CHECK_EQ_INT(fq_engine_dispatch(e, 0), 3);
    rec_clear_all(r, 3);
    fqt_engine_free(e);
}

/* E20: a worker that ends an operation does not keep the next one of its
 * queue for itself while a higher-QoS job waits for a worker. */
TEST(gap_worker_end_does_not_jump_a_higher_qos_job) {
    atomic_store(&gate_open, 0);
    fq_engine *e = fqt_engine("{\"workers\": 1}");
    fq_queue *a = fqt_queue(e, "a", 1);
    fq_queue *b = fqt_queue(e, "b", 4);
    rec hold = {0}, next = {0}, ui = {0};
    REQUIRE(fqt_block(a, body_hold, NULL, rec_done, &hold) > 0);
    REQUIRE(WAIT_UNTIL(fqt_stat(e, "running", -1) == 1, FQT_LONG_MS));
    REQUIRE(fqt_block(a, body_tag, "{\"qos\": \"background\"}", rec_done, &next) > 0);
    REQUIRE(fqt_block(b, body_tag, "{\"qos\": \"user-interactive\"}", rec_done, &ui) > 0);
    atomic_store(&gate_open, 1);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    if (!(atomic_load(&ui.start_seq) < atomic_load(&next.start_seq)))
        FAILF("the background op the ending worker started ran before the user-interactive one waiting for a worker");
    h_note("hold end %ld, ui start %ld, next start %ld", atomic_load(&hold.end_seq), atomic_load(&ui.start_seq), atomic_load(&next.start_seq));
    rec_clear(&hold); rec_clear(&next); rec_clear(&ui);
    fqt_engine_free(e);
}

/* E23: in poll mode too, fq_queue_wait waits for its own queue only. */
TEST(gap_poll_mode_queue_wait_is_per_queue) {
    fq_engine *e = fqt_engine("{\"delivery\": \"poll\"}");
    fq_queue *busy = fqt_queue(e, "busy", 1);
    fq_queue *idle = fqt_queue(e, "idle", 1);
    rec hold = {0}, r = {0};
    REQUIRE(fqt_async(busy, body_async_capture, NULL, rec_done, &hold) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&hold.op) != NULL, FQT_LONG_MS));
    REQUIRE(fqt_block(idle, body_tag, NULL, rec_done, &r) > 0);
    CHECK_OK(fq_queue_wait(idle, 2000));
    CHECK_EQ_INT(atomic_load(&r.calls), 1);
    CHECK_EQ_INT(fq_queue_wait(busy, 50), FQ_ERR_TIMEOUT);
    CHECK_OK(fq_op_finish(atomic_load(&hold.op), NULL, NULL));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    rec_clear(&hold); rec_clear(&r);
    fqt_engine_free(e);
}

/* R01: start deadlines expire in deadline order, whatever the submit order
 * (the timer's heap). */
TEST(gap_start_deadlines_expire_in_order) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    rec hold = {0}, w[4];
    memset(w, 0, sizeof w);
    static const int ms[4] = {100, 600, 300, 800};
    REQUIRE(fqt_async(q, body_async_capture, "{\"max_wait_ms\": 0}", rec_done, &hold) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&hold.op) != NULL, FQT_LONG_MS));
    for (int i = 0; i < 4; i++) {
        char o[48];
        snprintf(o, sizeof o, "{\"max_wait_ms\": %d}", ms[i]);
        w[i].tag = ms[i];
        REQUIRE(fqt_block(q, body_tag, o, rec_done, &w[i]) > 0);
    }
    CHECK(WAIT_UNTIL(atomic_load(&w[3].calls) == 1, 5000));
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(w[i].status, FQ_ERR_QUEUE_TIMEOUT);
    /* by deadline: 100 (0), 300 (2), 600 (1), 800 (3) */
    if (!(w[0].done_seq < w[2].done_seq && w[2].done_seq < w[1].done_seq && w[1].done_seq < w[3].done_seq))
        FAILF("failed out of deadline order: 100ms #%ld, 600ms #%ld, 300ms #%ld, 800ms #%ld",
              w[0].done_seq, w[1].done_seq, w[2].done_seq, w[3].done_seq);
    CHECK_OK(fq_op_finish(atomic_load(&hold.op), NULL, NULL));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    rec_clear(&hold); rec_clear_all(w, 4);
    fqt_engine_free(e);
}

/* D07, D08, D09: a failed operation's callback runs before those of the
 * dependents its failure cancelled ("in the order operations ended"). */
TEST(gap_failed_dependency_callback_before_its_dependents) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 4);
    rec a = {0}, d[3];
    memset(d, 0, sizeof d);
    fq_op_id ia = fqt_async(q, body_async_capture, NULL, rec_done, &a);
    REQUIRE(ia > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&a.op) != NULL, FQT_LONG_MS));
    char o[64];
    snprintf(o, sizeof o, "{\"depends_on\": [%lld]}", (long long)ia);
    for (int i = 0; i < 3; i++) REQUIRE(fqt_block(q, body_tag, o, rec_done, &d[i]) > 0);
    CHECK_OK(fq_op_finish(atomic_load(&a.op), NULL, "boom"));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(a.outcome, FQ_FAILED);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(d[i].status, FQ_ERR_DEPENDENCY);
        if (!(a.done_seq < d[i].done_seq)) FAILF("dependent %d called back before the failed op", i);
    }
    rec_clear(&a); rec_clear_all(d, 3);
    fqt_engine_free(e);
}

/* B04: with two barriers pending, what comes after the second waits for
 * the second, not only the first. */
TEST(gap_ops_after_a_second_barrier_wait_for_it) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 4);
    rec hold = {0}, b1 = {0}, b2 = {0}, after = {0};
    REQUIRE(fqt_async(q, body_async_capture, NULL, rec_done, &hold) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&hold.op) != NULL, FQT_LONG_MS));
    REQUIRE(fqt_block(q, body_tag, "{\"barrier\": true}", rec_done, &b1) > 0);
    REQUIRE(fqt_async(q, body_async_capture, "{\"barrier\": true}", rec_done, &b2) > 0);
    fq_op_id ia = fqt_block(q, body_tag, NULL, rec_done, &after);
    REQUIRE(ia > 0);
    CHECK_OK(fq_op_finish(atomic_load(&hold.op), NULL, NULL));
    REQUIRE(WAIT_UNTIL(atomic_load(&b2.op) != NULL, FQT_LONG_MS)); /* b2 runs */
    fqt_sleep_ms(100);
    CHECK_EQ_INT(fq_state(e, ia), FQ_STATE_WAITING);
    CHECK_EQ_INT(atomic_load(&after.body_runs), 0);
    CHECK_OK(fq_op_finish(atomic_load(&b2.op), NULL, NULL));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(after.outcome, FQ_SUCCEEDED);
    rec_clear(&hold); rec_clear(&b1); rec_clear(&b2); rec_clear(&after);
    fqt_engine_free(e);
}

/* W02: in poll mode fq_wait on an operation whose callback already returned
 * returns at once without running the callbacks waiting meanwhile. */
TEST(gap_poll_wait_for_a_delivered_op_runs_nothing) {
    fq_engine *e = fqt_engine("{\"delivery\": \"poll\"}");
    fq_queue *q = fqt_queue(e, "q", 1);
    rec a = {0}, b = {0};
    fq_op_id ia = fqt_block(q, body_tag, NULL, rec_done, &a);
    REQUIRE(ia > 0);
    CHECK_OK(fq_wait(e, ia, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&a.calls), 1);
    REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &b) > 0);
    REQUIRE(WAIT_UNTIL(fqt_stat(e, "succeeded", -1) == 2, FQT_LONG_MS)); /* b ended; its callback waits */
    CHECK_OK(fq_wait(e, ia, 0));
    CHECK_EQ_INT(atomic_load(&b.calls), 0);
    CHECK_EQ_INT(fq_engine_dispatch(e, 0), 1);
    rec_clear(&a); rec_clear(&b);
    fqt_engine_free(e);
}

/* Not a mutant: fq_add_dependency can make an older operation depend on a
 * newer one. A bulk cancel (newest first) then ends the older one through
 * its dependency before reaching it. What does each report? */
TEST(gap_bulk_cancel_with_an_added_dependency_on_a_newer_op) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    CHECK_OK(fq_queue_set_suspended(q, true));
    rec older = {0}, newer = {0};
    fq_op_id io = fqt_block(q, body_tag, "{\"group\": \"g\"}", rec_done, &older);
    fq_op_id in = fqt_block(q, body_tag, "{\"group\": \"g\"}", rec_done, &newer);
    REQUIRE(io > 0 && in > 0);
    CHECK_OK(fq_add_dependency(e, io, in));
    int n = fq_queue_cancel_all(q);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    h_note("fq_queue_cancel_all returned %d; older: outcome %d status %d (%s); newer: status %d; fq_cancel(older) again: %d",
           n, older.outcome, older.status, older.error, newer.status, fq_cancel(e, io));
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(older.status, FQ_ERR_CANCELLED);
    rec_clear(&older); rec_clear(&newer);
    fqt_engine_free(e);
}
