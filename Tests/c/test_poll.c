/* Poll-mode delivery: the event fd, fq_engine_dispatch, waits that dispatch. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fqt.h"

static int fd_readable(int fd, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, timeout_ms);
    return n > 0 && (p.revents & POLLIN) ? 1 : n < 0 ? -1 : 0;
}

static int count_calls(rec *r, int n) {
    int c = 0;
    for (int i = 0; i < n; i++) c += atomic_load(&r[i].calls);
    return c;
}

TEST(poll_mode_dispatch) {
    enum { N = 3 };
    fq_engine *e = fqt_engine("{\"delivery\": \"poll\"}");
    fq_queue *q = fqt_queue(e, "q", 2);
    int fd = fq_engine_event_fd(e);
    REQUIRE(fd >= 0);
    CHECK_EQ_INT(fq_engine_event_fd(e), fd); /* stable */
    CHECK_EQ_INT(fd_readable(fd, 0), 0);     /* nothing waits yet */
    CHECK_EQ_INT(fq_engine_dispatch(e, 0), 0);

    rec r[N];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++) {
        r[i].tag = i;
        REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &r[i]) > 0);
    }
    CHECK_EQ_INT(fd_readable(fd, h_scaled_ms(FQT_LONG_MS)), 1);
    /* all finished, none delivered: callbacks wait for a dispatcher */
    CHECK(WAIT_UNTIL(fqt_stat(e, "undelivered", -1) == N, FQT_LONG_MS));
    CHECK_EQ_INT(count_calls(r, N), 0);
    CHECK_EQ_INT(fqt_stat(e, "succeeded", -1), N);

    CHECK_EQ_INT(fq_engine_dispatch(e, 1), 1);
    CHECK_EQ_INT(count_calls(r, N), 1);
    CHECK_EQ_INT(fqt_stat(e, "undelivered", -1), N - 1);
    CHECK_EQ_INT(fd_readable(fd, 0), 1); /* still some waiting */
    CHECK_EQ_INT(fq_engine_dispatch(e, 0), N - 1);
    CHECK_EQ_INT(count_calls(r, N), N);
    for (int i = 0; i < N; i++) {
        CHECK(pthread_equal(r[i].thread, pthread_self()));
        CHECK_EQ_INT(r[i].outcome, FQ_SUCCEEDED);
        CHECK_EQ_INT(fqt_int(r[i].value, "tag", -1), i);
        CHECK(!pthread_equal(r[i].body_thread, pthread_self())); /* bodies on workers */
    }
    CHECK_EQ_INT(fq_engine_dispatch(e, 0), 0);
    CHECK_EQ_INT(fd_readable(fd, 0), 0); /* drained */
    CHECK_EQ_INT(fqt_stat(e, "undelivered", -1), 0);
    rec_clear_all(r, N);
    fqt_engine_free(e);
}

typedef struct {
    rec self; /* first: body_tag and rec_done see the userdata as a rec */
    fq_engine *e;
    fq_queue *q;
    int rc_dispatch;
    rec follow;
    fq_op_id follow_id;
} poll_reentry;

/* A body of a poll-mode engine that waits or dispatches: each is refused
 * (it could wait for itself or run callbacks inside a body), also a wait for
 * another queue than its own. */
typedef struct {
    rec self; /* first: rec_done sees the userdata as a rec */
    fq_engine *e;
    fq_queue *other;
    _Atomic int rc_wait_other, rc_wait_idle, rc_dispatch;
} poll_body_calls;

static json_t *body_waits_and_dispatches(fq_op *op, void *userdata) {
    (void)op;
    poll_body_calls *c = userdata;
    atomic_store(&c->rc_wait_other, fq_queue_wait(c->other, 100));
    atomic_store(&c->rc_wait_idle, fq_engine_wait_idle(c->e, 100));
    atomic_store(&c->rc_dispatch, fq_engine_dispatch(c->e, 0));
    return NULL;
}

static void poll_reentrant_done(const fq_result *res, void *userdata) {
    poll_reentry *x = userdata;
    rec_done(res, &x->self);
    x->rc_dispatch = fq_engine_dispatch(x->e, 0);
    x->follow_id = fqt_block(x->q, body_tag, NULL, rec_done, &x->follow);
}

TEST(poll_mode_waits_run_callbacks_here) {
    enum { N = 5 };
    fq_engine *e = fqt_engine("{\"delivery\": \"poll\"}");
    fq_queue *q = fqt_queue(e, "q", 2);
    fq_queue *q2 = fqt_queue(e, "q2", 2);
    rec r[N];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++) REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &r[i]) > 0);
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(atomic_load(&r[i].calls), 1);
        CHECK(pthread_equal(r[i].thread, pthread_self()));
    }
    rec_clear_all(r, N);

    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++)
        REQUIRE(fqt_block(i % 2 ? q : q2, body_tag, NULL, rec_done, &r[i]) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(atomic_load(&r[i].calls), 1);
        CHECK(pthread_equal(r[i].thread, pthread_self()));
    }
    rec_clear_all(r, N);

    /* dispatch from a callback is refused; submitting from it works and
     * wait_idle covers the follow-up */
    poll_reentry x;
    memset(&x, 0, sizeof x);
    x.e = e;
    x.q = q;
    REQUIRE(fqt_block(q, body_tag, NULL, poll_reentrant_done, &x) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(x.rc_dispatch, FQ_ERR_STATE);
    CHECK(x.follow_id > 0);
    CHECK_EQ_INT(atomic_load(&x.follow.calls), 1);
    CHECK(pthread_equal(x.follow.thread, pthread_self()));
    rec_clear(&x.self);
    rec_clear(&x.follow);

    /* waits and dispatch from an operation body: refused in poll mode too */
    poll_body_calls pc;
    memset(&pc, 0, sizeof pc);
    pc.e = e;
    pc.other = q2;
    REQUIRE(fqt_block(q, body_waits_and_dispatches, NULL, rec_done, &pc) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&pc.self.calls), 1);
    CHECK_EQ_INT(atomic_load(&pc.rc_wait_other), FQ_ERR_STATE);
    CHECK_EQ_INT(atomic_load(&pc.rc_wait_idle), FQ_ERR_STATE);
    CHECK_EQ_INT(atomic_load(&pc.rc_dispatch), FQ_ERR_STATE);
    rec_clear(&pc.self);

    /* a timeout while an async op blocks, in poll mode too */
    rec a = {0};
    REQUIRE(fqt_async(q, body_async_capture, NULL, rec_done, &a) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&a.op) != NULL, FQT_LONG_MS));
    CHECK_EQ_INT(fq_engine_wait_idle(e, 50), FQ_ERR_TIMEOUT);
    CHECK_EQ_INT(fq_queue_wait(q, 50), FQ_ERR_TIMEOUT);
    CHECK_EQ_INT(fqt_finish_in_thread(atomic_load(&a.op), json_true(), NULL), FQ_OK);
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&a.calls), 1);
    CHECK(pthread_equal(a.thread, pthread_self()));
    CHECK(json_is_true(a.value));
    rec_clear(&a);
    fqt_engine_free(e);
}

typedef struct {
    fq_engine *e;
    int fd;
    int want;
    int ran;
    pthread_t me;
} dispatcher;

static void *dispatcher_main(void *p) {
    dispatcher *d = p;
    d->me = pthread_self();
    long long deadline = fqt_now_ms() + h_scaled_ms(FQT_LONG_MS);
    while (d->ran < d->want && fqt_now_ms() < deadline) {
        if (fd_readable(d->fd, 100) == 1) {
            int n = fq_engine_dispatch(d->e, 0);
            if (n < 0) {
                FAILF("fq_engine_dispatch from a helper thread: %d", n);
                break;
            }
            d->ran += n;
        }
    }
    return NULL;
}

TEST(poll_mode_callbacks_on_the_dispatching_thread) {
    enum { N = 20 };
    fq_engine *e = fqt_engine("{\"delivery\": \"poll\"}");
    fq_queue *q = fqt_queue(e, "q", 4);
    dispatcher d = {.e = e, .fd = fq_engine_event_fd(e), .want = N};
    REQUIRE(d.fd >= 0);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, dispatcher_main, &d) == 0);
    rec r[N];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++) REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &r[i]) > 0);
    pthread_join(t, NULL);
    CHECK_EQ_INT(d.ran, N);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(atomic_load(&r[i].calls), 1);
        CHECK(pthread_equal(r[i].thread, d.me));
    }
    rec_clear_all(r, N);
    fqt_engine_free(e);
}

/* Several threads dispatching one engine (fq_engine_dispatch, and a wait
 * that dispatches): its callbacks still run one at a time, in completion
 * order. They used to overlap (399 of 400 in the report). */
enum { SERIAL_OPS = 400, SERIAL_THREADS = 3 };

typedef struct serial_state {
    fq_engine *e;
    atomic_int inside, overlaps, calls, next_seq, out_of_order;
    atomic_bool stop;
} serial_state;

static serial_state serial;

static void serial_done(const fq_result *r, void *ud) {
    (void)ud;
    if (atomic_fetch_add(&serial.inside, 1) != 0) atomic_fetch_add(&serial.overlaps, 1);
    /* ids are handed out in submit order, and one worker runs the queue
     * (max_concurrent 1): completion order is id order */
    int expected = atomic_fetch_add(&serial.next_seq, 1);
    if (fq_result_op_id(r) != (fq_op_id)(expected + 1)) atomic_fetch_add(&serial.out_of_order, 1);
    fqt_sleep_ms(0);  /* a yield: lets another dispatching thread try */
    for (volatile int spin = 0; spin < 2000; spin++) {}
    atomic_fetch_sub(&serial.inside, 1);
    atomic_fetch_add(&serial.calls, 1);
}

static void *serial_dispatcher(void *arg) {
    (void)arg;
    long long until = fqt_now_ms() + h_scaled_ms(FQT_LONG_MS);
    while (!atomic_load(&serial.stop) && fqt_now_ms() < until) {
        if (fq_engine_dispatch(serial.e, 1) < 0) break;
    }
    return NULL;
}

TEST(poll_mode_dispatching_threads_run_callbacks_one_at_a_time) {
    memset(&serial, 0, sizeof serial);
    serial.e = fqt_engine("{\"delivery\": \"poll\"}");
    fq_queue *q = fqt_queue(serial.e, "q", 1);
    CHECK_OK(fq_queue_set_suspended(q, true));
    for (int i = 0; i < SERIAL_OPS; i++) REQUIRE(fqt_block(q, body_noop, NULL, serial_done, NULL) == i + 1);
    pthread_t t[SERIAL_THREADS];
    for (int i = 0; i < SERIAL_THREADS; i++) REQUIRE(pthread_create(&t[i], NULL, serial_dispatcher, NULL) == 0);
    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_OK(fq_engine_wait_idle(serial.e, FQT_LONG_MS));  /* dispatches too */
    atomic_store(&serial.stop, true);
    for (int i = 0; i < SERIAL_THREADS; i++) pthread_join(t[i], NULL);
    CHECK_EQ_INT(atomic_load(&serial.calls), SERIAL_OPS);
    CHECK_EQ_INT(atomic_load(&serial.overlaps), 0);
    CHECK_EQ_INT(atomic_load(&serial.out_of_order), 0);
    fqt_engine_free(serial.e);
}
