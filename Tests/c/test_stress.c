/* Stress and races: 100 000 mixed operations with dependencies and cancels
 * from several threads; fq_op_finish racing fq_cancel. The invariant under
 * test is the completion contract: exactly one callback per accepted
 * operation, none for a rejected one, and a plausible outcome. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fqt.h"

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

enum { S_OPS = 100000, S_QUEUES = 3, S_GROUPS = 8, S_RECENT = 50 };
enum { K_BLOCK, K_BLOCK_FAIL, K_ASYNC_NOW, K_ASYNC_LATER };
static const int s_limits[S_QUEUES] = {1, 4, 16};
static const char *s_prio[] = {"very-low", "low", "normal", "high", "very-high"};
static const char *s_qos[] = {"user-interactive", "user-initiated", "default", "utility",
                              "background"};

typedef struct {
    atomic_llong id; /* set once the submit returned an id */
    atomic_int calls;
    atomic_int body_runs;
    atomic_int cancel_tried;
    atomic_int cancel_ok;
    atomic_int dep_mismatch;
    int kind, queue, group, ndeps, dep[2];
    bool accepted;
    /* written by the callback */
    int outcome, status;
    fq_op_id result_id;
    bool value_ok;
} sslot;

static struct {
    fq_engine *e;
    sslot *slot;
    atomic_int started;     /* submits begun: index + 1 */
    atomic_int stop;
    atomic_int group_mark[S_GROUPS]; /* see note in canceller */
    atomic_int running[S_QUEUES], max_running[S_QUEUES];
    atomic_int in_callback, max_in_callback;
    atomic_int cb_cancels, thread_cancels, group_cancels;
    /* deferred async finishes */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fq_op *pending[4096];
    sslot *pending_slot[4096];
    int npending;
    atomic_int finishers_stop;
} S;

static void bump_max(atomic_int *max, int now) {
    int m = atomic_load(max);
    while (now > m && !atomic_compare_exchange_weak(max, &m, now)) {
    }
}

static const char *kind_name(int k) {
    return k == K_BLOCK ? "block" : k == K_BLOCK_FAIL ? "failing block"
         : k == K_ASYNC_NOW ? "async finished in its start function" : "async finished later";
}

static int slot_index(const sslot *s) { return (int)(s - S.slot); }

/* Every dependency's value must be {"i": its index}. */
static void check_deps(fq_op *op, sslot *s) {
    for (int k = 0; k < s->ndeps; k++) {
        const sslot *d = &S.slot[s->dep[k]];
        json_t *v = fq_op_dependency_result(op, (fq_op_id)atomic_load(&d->id));
        if (fqt_int(v, "i", -1) != s->dep[k]) atomic_fetch_add(&s->dep_mismatch, 1);
    }
}

static void body_begin(fq_op *op, sslot *s) {
    atomic_fetch_add(&s->body_runs, 1);
    bump_max(&S.max_running[s->queue], atomic_fetch_add(&S.running[s->queue], 1) + 1);
    check_deps(op, s);
}

static json_t *stress_block(fq_op *op, void *userdata) {
    sslot *s = userdata;
    body_begin(op, s);
    atomic_fetch_sub(&S.running[s->queue], 1);
    if (s->kind == K_BLOCK_FAIL) {
        fq_op_set_error(op, "planned failure");
        return NULL;
    }
    return json_pack("{s:i}", "i", slot_index(s));
}

static void stress_async(fq_op *op, void *userdata) {
    sslot *s = userdata;
    body_begin(op, s);
    if (s->kind == K_ASYNC_NOW) {
        atomic_fetch_sub(&S.running[s->queue], 1);
        int rc = fq_op_finish(op, json_pack("{s:i}", "i", slot_index(s)), NULL);
        if (rc != FQ_OK) FAILF("fq_op_finish in the start function: %d", rc);
        return;
    }
    pthread_mutex_lock(&S.mu);
    if (S.npending < (int)(sizeof S.pending / sizeof *S.pending)) {
        S.pending[S.npending] = op;
        S.pending_slot[S.npending] = s;
        S.npending++;
        pthread_cond_signal(&S.cv);
        pthread_mutex_unlock(&S.mu);
    } else {
        pthread_mutex_unlock(&S.mu);
        FAILF("deferred-finish buffer full (more ops running than the limits allow?)");
        atomic_fetch_sub(&S.running[s->queue], 1);
        fq_op_finish(op, json_pack("{s:i}", "i", slot_index(s)), NULL);
    }
}

static void *finisher_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&S.mu);
    for (;;) {
        while (S.npending == 0 && !atomic_load(&S.finishers_stop))
            pthread_cond_wait(&S.cv, &S.mu);
        if (S.npending == 0) break;
        S.npending--;
        fq_op *op = S.pending[S.npending];
        sslot *s = S.pending_slot[S.npending];
        pthread_mutex_unlock(&S.mu);
        atomic_fetch_sub(&S.running[s->queue], 1);
        int rc = fq_op_finish(op, json_pack("{s:i}", "i", slot_index(s)), NULL);
        if (rc != FQ_OK) FAILF("fq_op_finish from a finisher thread: %d", rc);
        pthread_mutex_lock(&S.mu);
    }
    pthread_mutex_unlock(&S.mu);
    return NULL;
}

static void try_cancel(int idx, atomic_int *counter) {
    if (idx < 0) return;
    sslot *t = &S.slot[idx];
    fq_op_id id = (fq_op_id)atomic_load(&t->id);
    if (id <= 0) return;
    atomic_store(&t->cancel_tried, 1);
    int rc = fq_cancel(S.e, id);
    if (rc == FQ_OK) {
        atomic_store(&t->cancel_ok, 1);
        atomic_fetch_add(counter, 1);
    } else if (rc != FQ_ERR_NOT_FOUND) {
        FAILF("fq_cancel(%lld) = %d", (long long)id, rc);
    }
}

static void stress_done(const fq_result *res, void *userdata) {
    sslot *s = userdata;
    bump_max(&S.max_in_callback, atomic_fetch_add(&S.in_callback, 1) + 1);
    s->result_id = fq_result_op_id(res);
    s->outcome = (int)fq_result_outcome(res);
    s->status = fq_result_status(res);
    json_t *v = fq_result_value(res);
    s->value_ok = s->outcome != FQ_SUCCEEDED || fqt_int(v, "i", -1) == slot_index(s);
    /* now and then, cancel a recent operation from inside the callback */
    uint64_t h = (uint64_t)slot_index(s) * 0x9E3779B97F4A7C15ULL;
    if ((h >> 40) % 97 == 0) try_cancel(slot_index(s) - (int)((h >> 20) % 64), &S.cb_cancels);
    atomic_fetch_sub(&S.in_callback, 1);
    atomic_fetch_add(&s->calls, 1);
}

static void *canceller_main(void *arg) {
    (void)arg;
    uint64_t rng = 0xC0FFEE;
    long iter = 0;
    while (!atomic_load(&S.stop)) {
        int started = atomic_load(&S.started);
        if (started > 0) {
            int back = (int)(rng_next(&rng) % 3000);
            try_cancel(started - 1 - back, &S.thread_cancels);
        }
        if (++iter % 4000 == 0) {
            int g = (int)(rng_next(&rng) % S_GROUPS);
            int n = fq_cancel_group(S.e, (char[]){'g', (char)('0' + g), 0});
            if (n < 0) FAILF("fq_cancel_group: %d", n);
            atomic_fetch_add(&S.group_cancels, n > 0 ? n : 0);
            /* ops whose submit began after this point cannot be affected */
            atomic_store(&S.group_mark[g], atomic_load(&S.started));
        }
        struct timespec ts = {0, 20 * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

TEST_T(stress_100k_mixed_ops, 600) {
    memset(&S, 0, sizeof S);
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.cv, NULL);
    S.slot = calloc(S_OPS, sizeof *S.slot);
    REQUIRE(S.slot);
    S.e = fqt_engine("{\"workers\": 4}");
    fq_queue *q[S_QUEUES];
    char qname[S_QUEUES][16];
    for (int i = 0; i < S_QUEUES; i++) {
        snprintf(qname[i], sizeof qname[i], "s%d", i);
        q[i] = fqt_queue(S.e, qname[i], s_limits[i]);
    }
    pthread_t fin[2], canc;
    for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&fin[i], NULL, finisher_main, NULL) == 0);
    REQUIRE(pthread_create(&canc, NULL, canceller_main, NULL) == 0);

    uint64_t rng = 20240601;
    int accepted_ids[S_RECENT];
    int naccepted_recent = 0, accepted = 0, rejected_nf = 0;
    long long t0 = fqt_now_ms();
    for (int i = 0; i < S_OPS; i++) {
        sslot *s = &S.slot[i];
        uint64_t r = rng_next(&rng);
        s->queue = (int)(r % S_QUEUES);
        int k = (int)((r >> 8) % 100);
        s->kind = k < 45 ? K_BLOCK : k < 48 ? K_BLOCK_FAIL : k < 75 ? K_ASYNC_NOW : K_ASYNC_LATER;
        s->group = (r >> 16) % 4 == 0 ? (int)((r >> 20) % S_GROUPS) : -1;
        s->ndeps = 0;
        if ((r >> 24) % 10 < 3 && naccepted_recent > 0) {
            int nd = 1 + (int)((r >> 28) % 2);
            for (int d = 0; d < nd; d++) {
                int pick = accepted_ids[(r >> (32 + 8 * d)) % (uint64_t)naccepted_recent];
                if (d == 1 && pick == s->dep[0]) break;
                s->dep[s->ndeps++] = pick;
            }
        }
        json_t *o = json_object();
        json_object_set_new(o, "priority", json_string(s_prio[rng_next(&rng) % 5]));
        json_object_set_new(o, "qos", json_string(s_qos[rng_next(&rng) % 5]));
        if (s->group >= 0) {
            char g[4] = {'g', (char)('0' + s->group), 0, 0};
            json_object_set_new(o, "group", json_string(g));
        }
        if (s->ndeps) {
            json_t *a = json_array();
            for (int d = 0; d < s->ndeps; d++)
                json_array_append_new(a, json_integer(atomic_load(&S.slot[s->dep[d]].id)));
            json_object_set_new(o, "depends_on", a);
        }
        if (rng_next(&rng) % 2000 == 0) json_object_set_new(o, "barrier", json_true());

        atomic_store(&S.started, i + 1);
        fq_op_id id = (s->kind == K_BLOCK || s->kind == K_BLOCK_FAIL)
                          ? fq_submit_block(q[s->queue], stress_block, o, stress_done, s)
                          : fq_submit_async(q[s->queue], stress_async, o, stress_done, s);
        json_decref(o);
        if (id > 0) {
            s->accepted = true;
            atomic_store(&s->id, id);
            accepted++;
            if (naccepted_recent < S_RECENT) {
                accepted_ids[naccepted_recent++] = i;
            } else {
                accepted_ids[rng_next(&rng) % S_RECENT] = i; /* keep a recent sample */
            }
        } else if (id == FQ_ERR_NOT_FOUND && s->ndeps > 0) {
            rejected_nf++; /* a dependency left the history: no callback expected */
        } else {
            FAILF("submit %d failed: %lld (%s)", i, (long long)id, fq_last_error());
            if (h_failures() > 20) break;
        }
        /* a sliding window of recent ids: forget the oldest now and then */
        if (i % 1000 == 999) naccepted_recent = 0;
    }
    long long t_submit = fqt_now_ms() - t0;
    atomic_store(&S.stop, 1);
    pthread_join(canc, NULL);
    int rc = fq_engine_wait_idle(S.e, h_scaled_ms(300000));
    CHECK_EQ_INT(rc, FQ_OK);
    long long t_all = fqt_now_ms() - t0;
    pthread_mutex_lock(&S.mu);
    atomic_store(&S.finishers_stop, 1);
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
    for (int i = 0; i < 2; i++) pthread_join(fin[i], NULL);
    h_note("%d accepted, %d rejected (history), submit %lld ms, all done %lld ms; "
           "cancels ok: %d thread, %d callback, %d by group",
           accepted, rejected_nf, t_submit, t_all, atomic_load(&S.thread_cancels),
           atomic_load(&S.cb_cancels), atomic_load(&S.group_cancels));

    int missing = 0, extra = 0, spurious = 0, bad = 0, nsucc = 0, nfail = 0, ncanc = 0;
    int qsub[S_QUEUES] = {0}, qsucc[S_QUEUES] = {0}, qfail[S_QUEUES] = {0},
        qcanc[S_QUEUES] = {0};
#define BAD(...)                                                                      \
    do {                                                                              \
        if (bad++ < 15) FAILF(__VA_ARGS__);                                           \
    } while (0)
    for (int i = 0; i < S_OPS; i++) {
        sslot *s = &S.slot[i];
        int c = atomic_load(&s->calls);
        int runs = atomic_load(&s->body_runs);
        if (!s->accepted) {
            if (c || runs) spurious++;
            continue;
        }
        if (c == 0) {
            missing++;
            continue;
        }
        if (c > 1) extra++;
        if (runs > 1) BAD("op %d: body ran %d times", i, runs);
        if (s->result_id != (fq_op_id)atomic_load(&s->id))
            BAD("op %d: callback for id %lld, submitted as %lld", i, (long long)s->result_id,
                (long long)atomic_load(&s->id));
        if (atomic_load(&s->dep_mismatch))
            BAD("op %d: a dependency's result was not its value", i);
        bool deps_ok = true;
        for (int d = 0; d < s->ndeps; d++)
            if (S.slot[s->dep[d]].outcome != FQ_SUCCEEDED) deps_ok = false;
        bool group_hit = s->group >= 0 && i < atomic_load(&S.group_mark[s->group]);
        bool cancel_seen = atomic_load(&s->cancel_tried) || group_hit;
        qsub[s->queue]++;
        switch (s->outcome) {
        case FQ_SUCCEEDED:
            nsucc++;
            qsucc[s->queue]++;
            if (s->status != FQ_OK) BAD("op %d: succeeded with status %d", i, s->status);
            if (s->kind == K_BLOCK_FAIL) BAD("op %d: a failing body succeeded", i);
            if (!deps_ok) BAD("op %d: succeeded although a dependency did not", i);
            if (atomic_load(&s->cancel_ok))
                BAD("op %d (kind %s): fq_cancel returned FQ_OK but it succeeded", i,
                    kind_name(s->kind));
            if (!s->value_ok) BAD("op %d: wrong value", i);
            if (runs != 1) BAD("op %d: succeeded without running its body", i);
            break;
        case FQ_FAILED:
            nfail++;
            qfail[s->queue]++;
            if (s->kind != K_BLOCK_FAIL || s->status != FQ_ERR_OPERATION)
                BAD("op %d: failed (status %d) but kind %d", i, s->status, s->kind);
            if (!deps_ok) BAD("op %d: ran although a dependency did not succeed", i);
            if (atomic_load(&s->cancel_ok))
                BAD("op %d (kind %s): fq_cancel returned FQ_OK but it ended FAILED", i,
                    kind_name(s->kind));
            break;
        case FQ_CANCELLED:
            ncanc++;
            qcanc[s->queue]++;
            if (s->status == FQ_ERR_CANCELLED) {
                if (!cancel_seen) BAD("op %d: cancelled but nobody cancelled it", i);
            } else if (s->status == FQ_ERR_DEPENDENCY) {
                if (deps_ok) BAD("op %d: FQ_ERR_DEPENDENCY but all dependencies succeeded", i);
                if (runs) BAD("op %d: body ran but ended FQ_ERR_DEPENDENCY", i);
            } else {
                BAD("op %d: cancelled with status %d (%s)", i, s->status,
                    fq_strerror(s->status));
            }
            break;
        default:
            BAD("op %d: outcome %d", i, s->outcome);
        }
    }
#undef BAD
    CHECK_EQ_INT(missing, 0);
    CHECK_EQ_INT(extra, 0);
    CHECK_EQ_INT(spurious, 0);
    CHECK_EQ_INT(bad, 0);
    CHECK(nsucc > S_OPS / 2); /* the test must mostly exercise real work */
    CHECK(ncanc > 0);
    for (int i = 0; i < S_QUEUES; i++)
        if (atomic_load(&S.max_running[i]) > s_limits[i])
            FAILF("queue s%d: %d bodies at once, max_concurrent %d", i,
                  atomic_load(&S.max_running[i]), s_limits[i]);
    CHECK_EQ_INT(atomic_load(&S.max_in_callback), 1); /* thread delivery is serialized */

    json_t *st = fq_engine_stats(S.e);
    CHECK_EQ_INT(fqt_int(st, "submitted", -1), accepted);
    CHECK_EQ_INT(fqt_int(st, "succeeded", -1), nsucc);
    CHECK_EQ_INT(fqt_int(st, "failed", -1), nfail);
    CHECK_EQ_INT(fqt_int(st, "cancelled", -1), ncanc);
    CHECK_EQ_INT(fqt_int(st, "submitted", -1),
                 fqt_int(st, "succeeded", -2) + fqt_int(st, "failed", -2) +
                     fqt_int(st, "cancelled", -2));
    CHECK_EQ_INT(fqt_int(st, "queued", -1), 0);
    CHECK_EQ_INT(fqt_int(st, "running", -1), 0);
    CHECK_EQ_INT(fqt_int(st, "undelivered", -1), 0);
    json_t *qs = json_object_get(st, "queues");
    for (int i = 0; i < S_QUEUES; i++) {
        json_t *qo = json_object_get(qs, qname[i]);
        CHECK_EQ_INT(fqt_int(qo, "submitted", -1), qsub[i]);
        CHECK_EQ_INT(fqt_int(qo, "succeeded", -1), qsucc[i]);
        CHECK_EQ_INT(fqt_int(qo, "failed", -1), qfail[i]);
        CHECK_EQ_INT(fqt_int(qo, "cancelled", -1), qcanc[i]);
        CHECK_EQ_INT(fqt_int(qo, "queued", -1), 0);
        CHECK_EQ_INT(fqt_int(qo, "running", -1), 0);
    }
    json_decref(st);
    fqt_engine_free(S.e);
    free(S.slot);
}

/* ------------------------------------------------ fq_op_finish vs fq_cancel */

enum { RACE_ROUNDS = 2000 };

typedef struct {
    atomic_int calls;
    int outcome, status;
    long long value_i;
    atomic_llong id;
    int finish_rc, cancel_rc;
    _Atomic(fq_op *) op;
    atomic_int go;        /* block variant: the body returns when set */
    atomic_int body_runs;
} race_slot;

static struct {
    fq_engine *e;
    pthread_barrier_t start, end;
    race_slot *cur;
    bool block_variant;
    atomic_int quit;
} R;

static void race_done(const fq_result *res, void *userdata) {
    race_slot *s = userdata;
    s->outcome = (int)fq_result_outcome(res);
    s->status = fq_result_status(res);
    s->value_i = fqt_int(fq_result_value(res), "i", -1);
    atomic_fetch_add(&s->calls, 1);
}

static void race_async(fq_op *op, void *userdata) {
    race_slot *s = userdata;
    atomic_fetch_add(&s->body_runs, 1);
    atomic_store(&s->op, op);
}

static json_t *race_block(fq_op *op, void *userdata) {
    race_slot *s = userdata;
    atomic_fetch_add(&s->body_runs, 1);
    atomic_store(&s->op, op);
    long long deadline = fqt_now_ms() + h_scaled_ms(FQT_LONG_MS);
    while (!atomic_load(&s->go) && fqt_now_ms() < deadline) {
    }
    return json_pack("{s:i}", "i", 1);
}

static void *race_finisher(void *arg) {
    (void)arg;
    for (;;) {
        pthread_barrier_wait(&R.start);
        if (atomic_load(&R.quit)) return NULL;
        race_slot *s = R.cur;
        if (R.block_variant)
            atomic_store(&s->go, 1);
        else
            s->finish_rc = fq_op_finish(atomic_load(&s->op), json_pack("{s:i}", "i", 1), NULL);
        pthread_barrier_wait(&R.end);
    }
}

static void *race_canceller(void *arg) {
    (void)arg;
    for (;;) {
        pthread_barrier_wait(&R.start);
        if (atomic_load(&R.quit)) return NULL;
        race_slot *s = R.cur;
        s->cancel_rc = fq_cancel(R.e, (fq_op_id)atomic_load(&s->id));
        pthread_barrier_wait(&R.end);
    }
}

static void race_case(bool block_variant) {
    race_slot *slots = calloc(RACE_ROUNDS, sizeof *slots);
    REQUIRE(slots);
    R.e = fqt_engine(NULL);
    R.block_variant = block_variant;
    atomic_store(&R.quit, 0);
    fq_queue *q = fqt_queue(R.e, "race", 4);
    pthread_barrier_init(&R.start, NULL, 3);
    pthread_barrier_init(&R.end, NULL, 3);
    pthread_t a, b;
    REQUIRE(pthread_create(&a, NULL, race_finisher, NULL) == 0);
    REQUIRE(pthread_create(&b, NULL, race_canceller, NULL) == 0);
    int rounds = 0;
    for (int i = 0; i < RACE_ROUNDS; i++) {
        race_slot *s = &slots[i];
        s->finish_rc = 12345;
        fq_op_id id = block_variant ? fq_submit_block(q, race_block, NULL, race_done, s)
                                    : fq_submit_async(q, race_async, NULL, race_done, s);
        if (!CHECK(id > 0)) break;
        atomic_store(&s->id, id);
        if (!WAIT_UNTIL(atomic_load(&s->op) != NULL, FQT_LONG_MS)) {
            FAILF("round %d: the operation never started", i);
            atomic_store(&s->go, 1);
            break;
        }
        R.cur = s;
        pthread_barrier_wait(&R.start);
        pthread_barrier_wait(&R.end);
        rounds++;
    }
    atomic_store(&R.quit, 1);
    pthread_barrier_wait(&R.start);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    CHECK_OK(fq_engine_wait_idle(R.e, h_scaled_ms(120000)));
    int bad = 0, cancelled = 0, succeeded = 0;
    for (int i = 0; i < rounds; i++) {
        race_slot *s = &slots[i];
        int c = atomic_load(&s->calls);
        bool ok = c == 1 && atomic_load(&s->body_runs) == 1;
        if (!block_variant && s->finish_rc != FQ_OK) ok = false;
        if (s->cancel_rc == FQ_OK) {
            ok = ok && s->outcome == FQ_CANCELLED && s->status == FQ_ERR_CANCELLED;
            cancelled++;
        } else if (s->cancel_rc == FQ_ERR_NOT_FOUND) {
            ok = ok && s->outcome == FQ_SUCCEEDED && s->value_i == 1;
            succeeded++;
        } else {
            ok = false;
        }
        if (!ok && bad++ < 10)
            FAILF("round %d: %d callbacks, finish rc %d, cancel rc %d, outcome %d, status %d, "
                  "value %lld",
                  i, c, s->finish_rc, s->cancel_rc, s->outcome, s->status, s->value_i);
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(rounds, RACE_ROUNDS);
    h_note("%s: %d rounds: cancel won %d, finish won %d", block_variant ? "block" : "async",
           rounds, cancelled, succeeded);
    json_t *st = fq_engine_stats(R.e);
    CHECK_EQ_INT(fqt_int(st, "submitted", -1), rounds);
    CHECK_EQ_INT(fqt_int(st, "cancelled", -1), cancelled);
    CHECK_EQ_INT(fqt_int(st, "succeeded", -1), succeeded);
    json_decref(st);
    pthread_barrier_destroy(&R.start);
    pthread_barrier_destroy(&R.end);
    fqt_engine_free(R.e);
    free(slots);
}

TEST_T(race_finish_vs_cancel_exactly_once, 300) {
    race_case(false);
}

TEST_T(race_block_return_vs_cancel_exactly_once, 300) {
    race_case(true);
}
