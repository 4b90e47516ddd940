/* Dependencies: ordering across queues, data passing, failure propagation,
 * cycles, unknown ids, history. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fqt.h"

static json_t *body_n1(fq_op *op, void *userdata) {
    rec *r = userdata;
    (void)op;
    atomic_fetch_add(&r->body_runs, 1);
    atomic_store(&r->start_seq, fqt_seq());
    json_t *v = json_pack("{s:i}", "n", 1);
    atomic_store(&r->end_seq, fqt_seq());
    return v;
}

/* Reads dependency r->dep's {"n": k} and returns {"n": k + 1}; records in
 * r->tag what it saw (-1: no value). Also checks that a non-dependency gives
 * NULL. */
static json_t *body_n_plus_1(fq_op *op, void *userdata) {
    rec *r = userdata;
    atomic_fetch_add(&r->body_runs, 1);
    atomic_store(&r->start_seq, fqt_seq());
    json_t *d = fq_op_dependency_result(op, r->dep);
    json_t *n = json_object_get(d, "n");
    if (!json_is_integer(n)) {
        r->tag = -1;
        fq_op_set_error(op, "dependency result missing");
        return NULL;
    }
    r->tag = (int)json_integer_value(n);
    if (fq_op_dependency_result(op, fq_op_get_id(op)) != NULL)
        FAILF("fq_op_dependency_result(op, own id) is not NULL");
    if (fq_op_dependency_result(op, 987654321) != NULL)
        FAILF("fq_op_dependency_result(op, unknown id) is not NULL");
    json_t *v = json_pack("{s:I}", "n", (json_int_t)(r->tag + 1));
    atomic_store(&r->end_seq, fqt_seq());
    return v;
}

static json_t *body_fail_boom(fq_op *op, void *userdata) {
    rec *r = userdata;
    atomic_fetch_add(&r->body_runs, 1);
    CHECK_OK(fq_op_set_error(op, "boom"));
    return json_pack("{s:s}", "discarded", "yes"); /* discarded: it failed */
}

static char *deps_opts(fq_op_id a, fq_op_id b) {
    static char buf[128];
    if (b > 0)
        snprintf(buf, sizeof buf, "{\"depends_on\": [%lld, %lld]}", (long long)a, (long long)b);
    else
        snprintf(buf, sizeof buf, "{\"depends_on\": [%lld]}", (long long)a);
    return buf;
}

TEST(dependencies_pass_data_across_queues) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q1 = fqt_queue(e, "q1", 2);
    fq_queue *q2 = fqt_queue(e, "q2", 2);
    CHECK_OK(fq_queue_set_suspended(q1, true)); /* B and C must really wait */
    rec a = {0}, b = {0}, c = {0};
    fq_op_id ida = fqt_block(q1, body_n1, NULL, rec_done, &a);
    REQUIRE(ida > 0);
    b.dep = ida;
    fq_op_id idb = fqt_block(q1, body_n_plus_1, deps_opts(ida, 0), rec_done, &b);
    REQUIRE(idb > 0);
    c.dep = idb;
    fq_op_id idc = fqt_block(q2, body_n_plus_1, deps_opts(idb, 0), rec_done, &c);
    REQUIRE(idc > 0);
    CHECK(ida != idb && idb != idc && ida != idc);
    /* q2 runs, but C waits for B in the suspended q1 */
    CHECK_EQ_INT(fq_queue_wait(q2, 100), FQ_ERR_TIMEOUT);
    CHECK_EQ_INT(atomic_load(&c.body_runs), 0);
    CHECK_EQ_INT(fqt_qstat(e, "q2", "queued", -1), 1);
    CHECK_OK(fq_queue_set_suspended(q1, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));

    CHECK_EQ_INT(a.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(b.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(c.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(a.id, ida);
    CHECK_EQ_INT(b.id, idb);
    CHECK_EQ_INT(c.id, idc);
    CHECK_EQ_INT(fqt_int(a.value, "n", -1), 1);
    CHECK_EQ_INT(b.tag, 1);
    CHECK_EQ_INT(fqt_int(b.value, "n", -1), 2);
    CHECK_EQ_INT(c.tag, 2);
    CHECK_EQ_INT(fqt_int(c.value, "n", -1), 3);
    CHECK(atomic_load(&b.start_seq) > atomic_load(&a.end_seq));
    CHECK(atomic_load(&c.start_seq) > atomic_load(&b.end_seq));
    /* the values kept with json_incref in the callback outlive it */
    CHECK(json_is_object(a.value) && a.value->refcount >= 1);

    /* depends_on an op that already finished (still in history): runs, sees
     * its value */
    rec d = {0};
    d.dep = idc;
    fq_op_id idd = fqt_block(q2, body_n_plus_1, deps_opts(idc, ida), rec_done, &d);
    REQUIRE(idd > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(d.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(fqt_int(d.value, "n", -1), 4);
    rec_clear(&a);
    rec_clear(&b);
    rec_clear(&c);
    rec_clear(&d);
    fqt_engine_free(e);
}

TEST(failed_dependency_cancels_dependents) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q1 = fqt_queue(e, "q1", 2);
    fq_queue *q2 = fqt_queue(e, "q2", 2);
    CHECK_OK(fq_queue_set_suspended(q1, true));
    rec f = {0}, ok = {0}, d = {0}, dd = {0}, both = {0};
    fq_op_id idf = fqt_block(q1, body_fail_boom, NULL, rec_done, &f);
    fq_op_id idok = fqt_block(q1, body_n1, NULL, rec_done, &ok);
    REQUIRE(idf > 0 && idok > 0);
    fq_op_id idd = fqt_block(q2, body_tag, deps_opts(idf, 0), rec_done, &d);
    REQUIRE(idd > 0);
    fq_op_id iddd = fqt_block(q2, body_tag, deps_opts(idd, 0), rec_done, &dd);
    REQUIRE(iddd > 0);
    fq_op_id idboth = fqt_block(q2, body_tag, deps_opts(idok, idf), rec_done, &both);
    REQUIRE(idboth > 0);
    CHECK_OK(fq_queue_set_suspended(q1, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));

    CHECK_EQ_INT(f.outcome, FQ_FAILED);
    CHECK_EQ_INT(f.status, FQ_ERR_OPERATION);
    CHECK_STR(f.error, "boom");
    CHECK(f.value == NULL); /* set_error discards the returned value */
    CHECK_EQ_INT(ok.outcome, FQ_SUCCEEDED);
    rec *dependents[] = {&d, &dd, &both};
    fq_op_id named[] = {idf, idd, idf};
    for (int i = 0; i < 3; i++) {
        rec *r = dependents[i];
        CHECK_EQ_INT(atomic_load(&r->calls), 1);
        CHECK_EQ_INT(atomic_load(&r->body_runs), 0);
        CHECK_EQ_INT(r->outcome, FQ_CANCELLED);
        CHECK_EQ_INT(r->status, FQ_ERR_DEPENDENCY);
        if (!fqt_names_id(r->error, named[i]))
            FAILF("dependent %d: error \"%s\" does not name dependency %lld", i, r->error,
                  (long long)named[i]);
    }

    /* depending on the failed op after the fact: accepted, then cancelled */
    rec late = {0};
    fq_op_id idlate = fqt_block(q2, body_tag, deps_opts(idf, 0), rec_done, &late);
    REQUIRE(idlate > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(late.outcome, FQ_CANCELLED);
    CHECK_EQ_INT(late.status, FQ_ERR_DEPENDENCY);
    CHECK(fqt_names_id(late.error, idf));
    CHECK_EQ_INT(atomic_load(&late.body_runs), 0);

    /* a cancelled dependency also cancels its dependents */
    CHECK_OK(fq_queue_set_suspended(q1, true));
    rec g = {0}, h = {0};
    fq_op_id idg = fqt_block(q1, body_tag, NULL, rec_done, &g);
    REQUIRE(idg > 0);
    fq_op_id idh = fqt_block(q2, body_tag, deps_opts(idg, 0), rec_done, &h);
    REQUIRE(idh > 0);
    CHECK_OK(fq_cancel(e, idg));
    CHECK_OK(fq_queue_set_suspended(q1, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(g.outcome, FQ_CANCELLED);
    CHECK_EQ_INT(g.status, FQ_ERR_CANCELLED);
    CHECK_EQ_INT(h.outcome, FQ_CANCELLED);
    CHECK_EQ_INT(h.status, FQ_ERR_DEPENDENCY);
    CHECK(fqt_names_id(h.error, idg));
    CHECK_EQ_INT(atomic_load(&g.body_runs) + atomic_load(&h.body_runs), 0);

    json_t *s = fq_engine_stats(e);
    CHECK_EQ_INT(fqt_int(s, "submitted", -1), 8);
    CHECK_EQ_INT(fqt_int(s, "succeeded", -1), 1);
    CHECK_EQ_INT(fqt_int(s, "failed", -1), 1);
    CHECK_EQ_INT(fqt_int(s, "cancelled", -1), 6);
    json_decref(s);
    rec *all[] = {&f, &ok, &d, &dd, &both, &late, &g, &h};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        CHECK_EQ_INT(atomic_load(&all[i]->calls), 1);
        rec_clear(all[i]);
    }
    fqt_engine_free(e);
}

TEST(dependency_cycles_and_unknown_ids) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    fq_queue *q2 = fqt_queue(e, "q2", 1);
    CHECK_OK(fq_queue_set_suspended(q, true));
    CHECK_OK(fq_queue_set_suspended(q2, true));
    rec ra = {0}, rb = {0}, rc = {0};
    ra.tag = 1;
    rb.tag = 2;
    rc.tag = 3;
    fq_op_id a = fqt_block(q, body_tag, NULL, rec_done, &ra);
    fq_op_id b = fqt_block(q, body_tag, NULL, rec_done, &rb);
    fq_op_id c = fqt_block(q2, body_tag, NULL, rec_done, &rc);
    REQUIRE(a > 0 && b > 0 && c > 0);

    CHECK_OK(fq_add_dependency(e, a, b));                 /* a waits for b */
    CHECK_EQ_INT(fq_add_dependency(e, b, a), FQ_ERR_CYCLE);
    CHECK(fq_last_error()[0] != '\0');
    CHECK_EQ_INT(fq_add_dependency(e, a, a), FQ_ERR_CYCLE);
    CHECK_OK(fq_add_dependency(e, b, c));                 /* b waits for c (other queue) */
    CHECK_EQ_INT(fq_add_dependency(e, c, a), FQ_ERR_CYCLE); /* a -> b -> c -> a */
    CHECK_EQ_INT(fq_add_dependency(e, a, 987654321), FQ_ERR_NOT_FOUND);
    CHECK_EQ_INT(fq_add_dependency(e, 987654321, a), FQ_ERR_NOT_FOUND);

    /* depends_on with an unknown id: the submit fails, no callback ever */
    rec bad = {0};
    char opts[96];
    snprintf(opts, sizeof opts, "{\"depends_on\": [%lld, 987654321]}", (long long)a);
    fq_op_id idbad = fqt_block(q, body_tag, opts, rec_done, &bad);
    CHECK_EQ_INT(idbad, FQ_ERR_NOT_FOUND);
    CHECK(fq_last_error()[0] != '\0');
    rec bad2 = {0};
    CHECK_EQ_INT(fqt_async(q, body_async_capture, "{\"depends_on\": [987654321]}", rec_done,
                           &bad2),
                 FQ_ERR_NOT_FOUND);

    /* release: c, then b, then a must run in that order */
    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_EQ_INT(fq_queue_wait(q, 100), FQ_ERR_TIMEOUT); /* b waits for c */
    CHECK_EQ_INT(atomic_load(&ra.body_runs) + atomic_load(&rb.body_runs), 0);
    CHECK_OK(fq_queue_set_suspended(q2, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK(atomic_load(&rc.end_seq) < atomic_load(&rb.start_seq));
    CHECK(atomic_load(&rb.end_seq) < atomic_load(&ra.start_seq));
    CHECK_EQ_INT(ra.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(rb.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(rc.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(atomic_load(&bad.calls) + atomic_load(&bad.body_runs), 0);
    CHECK_EQ_INT(atomic_load(&bad2.calls) + atomic_load(&bad2.body_runs), 0);
    CHECK_EQ_INT(fqt_stat(e, "submitted", -1), 3);

    /* a started op cannot gain dependencies: FQ_ERR_STATE */
    rec run = {0}, other = {0};
    fq_op_id idrun = fqt_async(q, body_async_capture, NULL, rec_done, &run);
    REQUIRE(idrun > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&run.op) != NULL, FQT_LONG_MS));
    CHECK_OK(fq_queue_set_suspended(q2, true));
    fq_op_id idother = fqt_block(q2, body_tag, NULL, rec_done, &other);
    REQUIRE(idother > 0);
    CHECK_EQ_INT(fq_add_dependency(e, idrun, idother), FQ_ERR_STATE);
    /* a finished dependency added later counts as in depends_on */
    CHECK_OK(fq_add_dependency(e, idother, a));
    CHECK_OK(fq_op_finish(atomic_load(&run.op), NULL, NULL));
    CHECK_OK(fq_queue_set_suspended(q2, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(run.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(other.outcome, FQ_SUCCEEDED);
    rec_clear(&ra);
    rec_clear(&rb);
    rec_clear(&rc);
    rec_clear(&run);
    rec_clear(&other);
    fqt_engine_free(e);
}

/* A barrier waits for everything before it in its queue, and what comes
 * after it waits for the barrier: a dependency that closes a cycle through
 * those waits is refused, else the queue would never run them. A dependency
 * that closes none still works across a barrier. */
TEST(add_dependency_sees_the_waits_of_a_barrier) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 4);
    fq_queue *q2 = fqt_queue(e, "q2", 1);
    CHECK_OK(fq_queue_set_suspended(q, true));
    CHECK_OK(fq_queue_set_suspended(q2, true));
    rec ra = {0}, rb = {0}, rc = {0}, rx = {0};
    fq_op_id a = fqt_block(q, body_tag, NULL, rec_done, &ra);
    fq_op_id b = fqt_block(q, body_tag, "{\"barrier\": true}", rec_done, &rb);
    fq_op_id c = fqt_block(q, body_tag, NULL, rec_done, &rc);
    fq_op_id x = fqt_block(q2, body_tag, NULL, rec_done, &rx);
    REQUIRE(a > 0 && b > 0 && c > 0 && x > 0);

    CHECK_EQ_INT(fq_add_dependency(e, a, b), FQ_ERR_CYCLE); /* b waits for a */
    CHECK_CONTAINS(fq_last_error(), "cycle");
    CHECK_EQ_INT(fq_add_dependency(e, a, c), FQ_ERR_CYCLE); /* c -> b -> a */
    CHECK_OK(fq_add_dependency(e, x, c));                   /* x -> c -> b -> a */
    CHECK_EQ_INT(fq_add_dependency(e, a, x), FQ_ERR_CYCLE); /* through another queue */
    CHECK_OK(fq_add_dependency(e, c, a));                   /* already so: no cycle */

    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_OK(fq_queue_set_suspended(q2, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(ra.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(rb.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(rc.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(rx.outcome, FQ_SUCCEEDED);
    CHECK(atomic_load(&ra.end_seq) < atomic_load(&rb.start_seq));
    CHECK(atomic_load(&rb.end_seq) < atomic_load(&rc.start_seq));
    CHECK(atomic_load(&rc.end_seq) < atomic_load(&rx.start_seq));
    CHECK_EQ_INT(atomic_load(&ra.calls) + atomic_load(&rb.calls) + atomic_load(&rc.calls) +
                     atomic_load(&rx.calls), 4);
    rec_clear(&ra);
    rec_clear(&rb);
    rec_clear(&rc);
    rec_clear(&rx);
    fqt_engine_free(e);
}

TEST(add_dependency_on_failed_op_cancels) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    rec f = {0}, x = {0};
    fq_op_id idf = fqt_block(q, body_fail_boom, NULL, rec_done, &f);
    REQUIRE(idf > 0);
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    CHECK_OK(fq_queue_set_suspended(q, true));
    fq_op_id idx = fqt_block(q, body_tag, NULL, rec_done, &x);
    REQUIRE(idx > 0);
    CHECK_OK(fq_add_dependency(e, idx, idf));
    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(x.outcome, FQ_CANCELLED);
    CHECK_EQ_INT(x.status, FQ_ERR_DEPENDENCY);
    CHECK(fqt_names_id(x.error, idf));
    CHECK_EQ_INT(atomic_load(&x.body_runs), 0);
    rec_clear(&f);
    rec_clear(&x);
    fqt_engine_free(e);
}

TEST(history_bounds_depends_on) {
    fq_engine *e = fqt_engine("{\"history\": 2}");
    fq_queue *q = fqt_queue(e, "q", 1);
    enum { N = 6 };
    rec r[N];
    memset(r, 0, sizeof r);
    fq_op_id id[N];
    for (int i = 0; i < N; i++) {
        r[i].tag = i;
        id[i] = fqt_block(q, body_tag, NULL, rec_done, &r[i]);
        REQUIRE(id[i] > 0);
        CHECK_OK(fq_queue_wait(q, FQT_LONG_MS)); /* finish in order */
    }
    /* the oldest is forgotten, the newest still known */
    rec old = {0}, recent = {0};
    CHECK_EQ_INT(fqt_block(q, body_tag, deps_opts(id[0], 0), rec_done, &old),
                 FQ_ERR_NOT_FOUND);
    recent.dep = id[N - 1];
    fq_op_id idr = fqt_block(q, body_tag, deps_opts(id[N - 1], 0), rec_done, &recent);
    CHECK(idr > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&old.calls), 0);
    CHECK_EQ_INT(recent.outcome, FQ_SUCCEEDED);
    /* The same once dependent submits no longer wait for the engine lock
     * (the first one, `recent`, let the later ones through the inbox):
     * after 2 more finish, `recent` is forgotten and naming it fails the
     * submit itself; the newest is still known. */
    rec more[2], late = {0}, newest = {0};
    memset(more, 0, sizeof more);
    fq_op_id idm[2];
    for (int i = 0; i < 2; i++) {
        idm[i] = fqt_block(q, body_tag, NULL, rec_done, &more[i]);
        REQUIRE(idm[i] > 0);
        CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    }
    CHECK_EQ_INT(fqt_block(q, body_tag, deps_opts(idr, 0), rec_done, &late), FQ_ERR_NOT_FOUND);
    CHECK(strstr(fq_last_error(), "history") != NULL);
    newest.dep = idm[1];
    CHECK(fqt_block(q, body_tag, deps_opts(idm[1], 0), rec_done, &newest) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&late.calls), 0);
    CHECK_EQ_INT(newest.outcome, FQ_SUCCEEDED);
    rec_clear_all(r, N);
    rec_clear_all(more, 2);
    rec_clear(&recent);
    rec_clear(&newest);
    fqt_engine_free(e);

    /* history 0: nothing finished is remembered */
    e = fqt_engine("{\"history\": 0}");
    q = fqt_queue(e, "q", 1);
    rec a = {0}, b = {0};
    fq_op_id ida = fqt_block(q, body_tag, NULL, rec_done, &a);
    REQUIRE(ida > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(fqt_block(q, body_tag, deps_opts(ida, 0), rec_done, &b), FQ_ERR_NOT_FOUND);
    /* again once the failed dependent submit has let the later ones
     * through the inbox */
    rec c = {0}, d = {0};
    fq_op_id idc = fqt_block(q, body_tag, NULL, rec_done, &c);
    REQUIRE(idc > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(fqt_block(q, body_tag, deps_opts(idc, 0), rec_done, &d), FQ_ERR_NOT_FOUND);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&b.calls), 0);
    CHECK_EQ_INT(atomic_load(&d.calls), 0);
    rec_clear(&a);
    rec_clear(&c);
    fqt_engine_free(e);
}

/* Block body: records in r->tag what fq_state() says of its own operation
 * (r->user is the engine). */
static json_t *body_reads_own_state(fq_op *op, void *userdata) {
    rec *r = userdata;
    atomic_fetch_add(&r->body_runs, 1);
    r->tag = fq_state(r->user, fq_op_get_id(op));
    return NULL;
}

/* A completion callback that records fq_state() of the ended operation in
 * `seen` before rec_done. */
typedef struct state_rec {
    rec r;
    fq_engine *engine;
    atomic_int seen;
} state_rec;

static void state_rec_done(const fq_result *res, void *userdata) {
    state_rec *s = userdata;
    atomic_store(&s->seen, fq_state(s->engine, fq_result_op_id(res)));
    rec_done(res, &s->r);
}

TEST(fq_state_follows_an_operation_from_submit_to_end) {
    fq_engine *e = fqt_engine("{\"history\": 6}");
    fq_queue *q = fqt_queue(e, "q", 1);
    fq_queue *held = fqt_queue(e, "held", 4);
    CHECK_OK(fq_queue_set_suspended(held, true));
    rec a = {0}, b = {0}, c = {0}, d = {0}, bar = {0}, after = {0};
    state_rec ended = {.engine = e};
    fq_op_id ida = fqt_async(q, body_async_capture, NULL, rec_done, &a);
    REQUIRE(ida > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&a.op) != NULL, FQT_LONG_MS));
    c.user = e;
    fq_op_id idb = fqt_block(q, body_tag, NULL, rec_done, &b);
    fq_op_id idc = fqt_block(q, body_reads_own_state, deps_opts(ida, 0), rec_done, &c);
    fq_op_id idd = fqt_block(held, body_tag, NULL, rec_done, &d);
    fq_op_id idbar = fqt_block(q, body_tag, "{\"barrier\": true}", rec_done, &bar);
    fq_op_id idafter = fqt_block(q, body_tag, NULL, rec_done, &after);
    REQUIRE(idb > 0 && idc > 0 && idd > 0 && idbar > 0 && idafter > 0);
    CHECK_EQ_INT(fq_state(e, ida), FQ_STATE_RUNNING);
    CHECK_EQ_INT(fq_state(e, idb), FQ_STATE_READY);       /* waits for the one place */
    CHECK_EQ_INT(fq_state(e, idc), FQ_STATE_WAITING);     /* for a */
    CHECK_EQ_INT(fq_state(e, idd), FQ_STATE_READY);       /* for its queue's resume */
    CHECK_EQ_INT(fq_state(e, idbar), FQ_STATE_WAITING);   /* for those before it */
    CHECK_EQ_INT(fq_state(e, idafter), FQ_STATE_WAITING); /* for the barrier */
    CHECK_OK(fq_cancel(e, idd));
    CHECK_EQ_INT(fq_state(e, idd), FQ_STATE_CANCELLED);
    CHECK_OK(fqt_finish_in_thread(atomic_load(&a.op), json_pack("{s:i}", "n", 1), NULL));
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    CHECK_EQ_INT(c.tag, FQ_STATE_RUNNING); /* read inside its own body */
    CHECK_EQ_INT(fq_state(e, ida), FQ_STATE_SUCCEEDED);
    CHECK_EQ_INT(fq_state(e, idafter), FQ_STATE_SUCCEEDED);
    /* In its completion callback an operation has ended. */
    fq_op_id idf = fqt_block(q, body_fail_boom, NULL, state_rec_done, &ended);
    REQUIRE(idf > 0);
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&ended.seen), FQ_STATE_FAILED);
    CHECK_EQ_INT(fq_state(e, idf), FQ_STATE_FAILED);
    /* history 6: of the seven ended, the first (d, cancelled) is forgotten. */
    CHECK_EQ_INT(fq_state(e, ida), FQ_STATE_SUCCEEDED);
    CHECK_EQ_INT(fq_state(e, idd), FQ_ERR_NOT_FOUND);
    CHECK(strstr(fq_last_error(), "history") != NULL);
    CHECK_EQ_INT(fq_state(e, 987654321), FQ_ERR_NOT_FOUND);
    CHECK_EQ_INT(fq_state(e, 0), FQ_ERR_NOT_FOUND);
    CHECK_EQ_INT(fq_state(NULL, idf), FQ_ERR_INVALID);
    rec *all[] = {&a, &b, &c, &d, &bar, &after, &ended.r};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        CHECK_EQ_INT(atomic_load(&all[i]->calls), 1);
        rec_clear(all[i]);
    }
    fq_queue_free(held);
    fq_queue_free(q);
    fqt_engine_free(e);
}

/* Records in r->tag whether dependency r->dep's value was handed over
 * (1) or not (0), and the value of fq_op_dependency() too (2 when both). */
static json_t *body_sees_dep(fq_op *op, void *userdata) {
    rec *r = userdata;
    atomic_fetch_add(&r->body_runs, 1);
    atomic_store(&r->start_seq, fqt_seq());
    r->tag = (fq_op_dependency_result(op, r->dep) != NULL) + (fq_op_dependency(op, r->dep) != NULL);
    atomic_store(&r->end_seq, fqt_seq());
    return NULL;
}

TEST(remove_dependency_lets_an_operation_go_without_it) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *held = fqt_queue(e, "held", 2);
    fq_queue *q = fqt_queue(e, "q", 2);
    CHECK_OK(fq_queue_set_suspended(held, true));
    rec ra = {0}, rb = {0}, rf = {0}, rc = {0}, rdone = {0}, rd = {0};
    fq_op_id a = fqt_block(held, body_n1, NULL, rec_done, &ra);
    fq_op_id f = fqt_block(held, body_fail_boom, NULL, rec_done, &rf);
    REQUIRE(a > 0 && f > 0);

    /* b waits for a (held): removed, it runs while a still waits */
    fq_op_id b = fqt_block(q, body_tag, deps_opts(a, 0), rec_done, &rb);
    REQUIRE(b > 0);
    CHECK_EQ_INT(fq_queue_wait(q, 100), FQ_ERR_TIMEOUT);
    CHECK_EQ_INT(fq_state(e, b), FQ_STATE_WAITING);
    CHECK_OK(fq_remove_dependency(e, b, a));
    CHECK_OK(fq_wait(e, b, FQT_LONG_MS));
    CHECK_EQ_INT(rb.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(atomic_load(&rb.body_runs), 1);
    CHECK_EQ_INT(fq_state(e, a), FQ_STATE_READY);
    /* removed again: not (any longer) a dependency; b has finished anyway */
    CHECK_EQ_INT(fq_remove_dependency(e, b, a), FQ_ERR_STATE);
    CHECK_CONTAINS(fq_last_error(), "finished");

    /* c waits for f (which will fail) and a: without f, f's failure no
     * longer cancels it; it still waits for a */
    fq_op_id c = fqt_block(q, body_tag, deps_opts(f, a), rec_done, &rc);
    REQUIRE(c > 0);
    CHECK_OK(fq_remove_dependency(e, c, f));
    CHECK_EQ_INT(fq_remove_dependency(e, c, f), FQ_ERR_NOT_FOUND);
    CHECK_CONTAINS(fq_last_error(), "does not depend on");
    CHECK_EQ_INT(fq_state(e, c), FQ_STATE_WAITING);

    /* a finished dependency: its value is no longer handed over */
    fq_op_id done = fqt_block(q, body_n1, NULL, rec_done, &rdone);
    REQUIRE(done > 0);
    CHECK_OK(fq_wait(e, done, FQT_LONG_MS));
    rd.dep = done;
    fq_op_id d = fqt_block(q, body_sees_dep, deps_opts(done, a), rec_done, &rd);
    REQUIRE(d > 0);
    CHECK_OK(fq_add_dependency(e, d, done)); /* again: it counts once */
    CHECK_OK(fq_add_dependency(e, d, done));
    CHECK_OK(fq_remove_dependency(e, d, done));
    CHECK_EQ_INT(fq_remove_dependency(e, d, done), FQ_ERR_NOT_FOUND);

    CHECK_OK(fq_queue_set_suspended(held, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(ra.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(rf.outcome, FQ_FAILED);
    CHECK_EQ_INT(rc.outcome, FQ_SUCCEEDED);
    CHECK(atomic_load(&rc.start_seq) > atomic_load(&ra.end_seq)); /* still waited for a */
    CHECK(atomic_load(&rb.end_seq) < atomic_load(&ra.start_seq));
    CHECK_EQ_INT(rd.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(rd.tag, 0);
    CHECK(atomic_load(&rd.start_seq) > atomic_load(&ra.end_seq));
    rec *all[] = {&ra, &rb, &rf, &rc, &rdone, &rd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        CHECK_EQ_INT(atomic_load(&all[i]->calls), 1);
        rec_clear(all[i]);
    }
    fqt_engine_free(e);
}

TEST(remove_dependency_refuses_what_is_not_a_dependency_of_its_own) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    fq_queue *q2 = fqt_queue(e, "q2", 1);
    CHECK_OK(fq_queue_set_suspended(q, true));
    CHECK_OK(fq_queue_set_suspended(q2, true));
    rec ra = {0}, rbar = {0}, rc = {0}, rx = {0}, ry = {0};
    fq_op_id a = fqt_block(q, body_tag, NULL, rec_done, &ra);
    fq_op_id bar = fqt_block(q, body_tag, "{\"barrier\": true}", rec_done, &rbar);
    fq_op_id c = fqt_block(q, body_tag, NULL, rec_done, &rc);
    fq_op_id x = fqt_block(q2, body_tag, NULL, rec_done, &rx);
    REQUIRE(a > 0 && bar > 0 && c > 0 && x > 0);

    CHECK_EQ_INT(fq_remove_dependency(e, c, bar), FQ_ERR_STATE); /* a barrier's wait */
    CHECK_CONTAINS(fq_last_error(), "barrier");
    CHECK_EQ_INT(fq_remove_dependency(e, bar, a), FQ_ERR_STATE);
    CHECK_EQ_INT(fq_remove_dependency(e, x, a), FQ_ERR_NOT_FOUND); /* no edge */
    CHECK_EQ_INT(fq_remove_dependency(e, 987654321, a), FQ_ERR_NOT_FOUND);
    CHECK_EQ_INT(fq_remove_dependency(e, x, 987654321), FQ_ERR_NOT_FOUND);
    CHECK_EQ_INT(fq_remove_dependency(e, x, x), FQ_ERR_NOT_FOUND);
    CHECK_EQ_INT(fq_remove_dependency(NULL, x, a), FQ_ERR_INVALID);

    /* added, then removed: the cycle check sees the edge gone */
    CHECK_OK(fq_add_dependency(e, x, c));
    CHECK_EQ_INT(fq_add_dependency(e, a, x), FQ_ERR_CYCLE);
    CHECK_OK(fq_remove_dependency(e, x, c));
    CHECK_OK(fq_add_dependency(e, a, x)); /* a now waits for x */
    CHECK_EQ_INT(fq_state(e, a), FQ_STATE_WAITING);

    /* a running operation: too late */
    CHECK_OK(fq_queue_set_suspended(q2, false));
    CHECK_OK(fq_wait(e, x, FQT_LONG_MS));
    fq_op_id y = fqt_block(q2, body_tag, deps_opts(c, 0), rec_done, &ry);
    REQUIRE(y > 0);
    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(fq_remove_dependency(e, y, c), FQ_ERR_STATE);
    CHECK(atomic_load(&rx.end_seq) < atomic_load(&ra.start_seq));
    rec *all[] = {&ra, &rbar, &rc, &rx, &ry};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        CHECK_EQ_INT(all[i]->outcome, FQ_SUCCEEDED);
        CHECK_EQ_INT(atomic_load(&all[i]->calls), 1);
        rec_clear(all[i]);
    }
    fqt_engine_free(e);
}
