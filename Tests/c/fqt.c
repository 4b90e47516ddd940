#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fqt.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

long long fqt_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void fqt_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

json_t *fqt_json(const char *text) {
    json_error_t err;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &err);
    if (!j) FAILF("bad JSON in the test itself: %s: %s", text, err.text);
    REQUIRE(j != NULL);
    return j;
}

fq_engine *fqt_engine(const char *config_text) {
    json_t *cfg = config_text ? fqt_json(config_text) : NULL;
    char errbuf[512] = "";
    fq_engine *e = fq_engine_new(cfg, errbuf, sizeof errbuf);
    if (!e) FAILF("fq_engine_new(%s) failed: %s", config_text ? config_text : "NULL", errbuf);
    json_decref(cfg);
    REQUIRE(e != NULL);
    return e;
}

fq_queue *fqt_queue(fq_engine *e, const char *name, int max_concurrent) {
    fq_queue *q = fq_queue_new(e, name, max_concurrent);
    if (!q) FAILF("fq_queue_new(%s, %d) failed: %s", name, max_concurrent, fq_last_error());
    REQUIRE(q != NULL);
    return q;
}

void fqt_engine_free(fq_engine *e) { CHECK_EQ_INT(fq_engine_free(e), FQ_OK); }

fq_op_id fqt_block(fq_queue *q, fq_block_fn fn, const char *options_text,
                   fq_completion_fn done, void *userdata) {
    json_t *o = options_text ? fqt_json(options_text) : NULL;
    fq_op_id id = fq_submit_block(q, fn, o, done, userdata);
    json_decref(o);
    return id;
}

fq_op_id fqt_async(fq_queue *q, fq_async_fn fn, const char *options_text,
                   fq_completion_fn done, void *userdata) {
    json_t *o = options_text ? fqt_json(options_text) : NULL;
    fq_op_id id = fq_submit_async(q, fn, o, done, userdata);
    json_decref(o);
    return id;
}

static atomic_long g_seq;

long fqt_seq(void) { return atomic_fetch_add(&g_seq, 1) + 1; }

void rec_done(const fq_result *res, void *userdata) {
    rec *r = userdata;
    int prior = atomic_load(&r->calls);
    if (prior > 0) {
        FAILF("completion callback called again for op %lld (tag %d): call #%d",
              (long long)fq_result_op_id(res), r->tag, prior + 1);
        atomic_fetch_add(&r->calls, 1);
        return;
    }
    r->id = fq_result_op_id(res);
    r->outcome = (int)fq_result_outcome(res);
    r->status = fq_result_status(res);
    const char *err = fq_result_error(res);
    r->has_error = err != NULL;
    snprintf(r->error, sizeof r->error, "%s", err ? err : "");
    json_t *v = fq_result_value(res);
    r->value = v ? json_incref(v) : NULL;
    r->thread = pthread_self();
    r->done_seq = fqt_seq();
    atomic_fetch_add(&r->calls, 1);
}

void rec_clear(rec *r) {
    json_decref(r->value);
    r->value = NULL;
}

void rec_clear_all(rec *r, int n) {
    for (int i = 0; i < n; i++) rec_clear(&r[i]);
}

json_t *body_tag(fq_op *op, void *userdata) {
    rec *r = userdata;
    atomic_store(&r->start_seq, fqt_seq());
    atomic_store(&r->body_id, (long long)fq_op_get_id(op));
    r->body_thread = pthread_self();
    atomic_fetch_add(&r->body_runs, 1);
    json_t *v = json_pack("{s:i}", "tag", r->tag);
    atomic_store(&r->end_seq, fqt_seq());
    return v;
}

json_t *body_noop(fq_op *op, void *userdata) {
    (void)op;
    (void)userdata;
    return NULL;
}

void body_async_finish_now(fq_op *op, void *userdata) {
    (void)userdata;
    int rc = fq_op_finish(op, NULL, NULL);
    if (rc != FQ_OK) FAILF("fq_op_finish in the start function: %d", rc);
}

void body_async_capture(fq_op *op, void *userdata) {
    rec *r = userdata;
    atomic_store(&r->start_seq, fqt_seq());
    atomic_store(&r->body_id, (long long)fq_op_get_id(op));
    r->body_thread = pthread_self();
    atomic_fetch_add(&r->body_runs, 1);
    atomic_store(&r->op, op);
}

typedef struct {
    fq_op *op;
    json_t *value;
    const char *error;
    int rc;
} finish_args;

static void *finish_thread(void *p) {
    finish_args *a = p;
    a->rc = fq_op_finish(a->op, a->value, a->error);
    return NULL;
}

int fqt_finish_in_thread(fq_op *op, json_t *value, const char *error) {
    finish_args a = {op, value, error, 12345};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, finish_thread, &a) == 0);
    pthread_join(t, NULL);
    return a.rc;
}

long long fqt_int(const json_t *obj, const char *key, long long dflt) {
    json_t *v = json_object_get(obj, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : dflt;
}

long long fqt_qstat(fq_engine *e, const char *queue, const char *key, long long dflt) {
    json_t *s = fq_engine_stats(e);
    long long v = fqt_int(json_object_get(json_object_get(s, "queues"), queue), key, dflt);
    json_decref(s);
    return v;
}

long long fqt_stat(fq_engine *e, const char *key, long long dflt) {
    json_t *s = fq_engine_stats(e);
    long long v = fqt_int(s, key, dflt);
    json_decref(s);
    return v;
}

bool fqt_names_id(const char *msg, long long id) {
    if (!msg) return false;
    char want[32];
    snprintf(want, sizeof want, "%lld", id);
    size_t wl = strlen(want);
    for (const char *p = msg; *p; p++) {
        if (!isdigit((unsigned char)*p)) continue;
        const char *s = p;
        while (isdigit((unsigned char)*p)) p++;
        if ((size_t)(p - s) == wl && strncmp(s, want, wl) == 0) return true;
        if (!*p) break;
    }
    return false;
}
