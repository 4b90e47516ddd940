/* The API surface: version, status strings, last error, NULL handles and
 * unknown ids, config/option/queue validation, the stats document. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fqt.h"

TEST(version_matches_header) {
    CHECK_EQ_INT(fq_version(), FQ_VERSION_HEX);
    CHECK_STR(fq_version_string(), FQ_VERSION_STRING);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", FQ_VERSION_MAJOR, FQ_VERSION_MINOR,
             FQ_VERSION_PATCH);
    CHECK_STR(FQ_VERSION_STRING, want);
    CHECK(fq_version_string() == fq_version_string()); /* static, never freed */
}

TEST(strerror_every_status_distinct) {
    const int first = FQ_ERR_NOMEM, last = FQ_OK;
    const char *seen[32] = {0};
    for (int s = first; s <= last; s++) {
        const char *m = fq_strerror(s);
        if (!CHECK(m != NULL)) continue;
        if (!CHECK(m[0] != '\0')) FAILF("fq_strerror(%d) is empty", s);
        seen[s - first] = m;
        for (int t = first; t < s; t++)
            if (seen[t - first] && strcmp(seen[t - first], m) == 0)
                FAILF("fq_strerror(%d) == fq_strerror(%d) == \"%s\"", s, t, m);
    }
    /* unknown statuses still get a string */
    CHECK(fq_strerror(12345) != NULL);
    CHECK(fq_strerror(-12345) != NULL);
    CHECK(fq_strerror(FQ_ERR_NOMEM - 1) != NULL);
}

static void *last_error_fresh_thread(void *p) {
    const char **out = p;
    *out = fq_last_error();
    return NULL;
}

static void *last_error_fail_in_thread(void *p) {
    (void)p;
    fq_queue *q = fq_queue_new(NULL, "x", 1); /* fails */
    return (void *)(q == NULL && fq_last_error() && fq_last_error()[0] ? "ok" : NULL);
}

TEST(last_error_is_per_thread) {
    /* a thread that made no call: "" (not NULL) */
    const char *fresh = (const char *)1;
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, last_error_fresh_thread, &fresh) == 0);
    pthread_join(t, NULL);
    CHECK(fresh != NULL);
    if (fresh) CHECK_STR(fresh, "");

    /* a failure on this thread leaves a message */
    CHECK(fq_queue_new(NULL, "q", 1) == NULL);
    const char *m = fq_last_error();
    REQUIRE(m != NULL);
    CHECK(m[0] != '\0');
    char mine[512];
    snprintf(mine, sizeof mine, "%s", m);

    /* a failure on another thread does not touch ours */
    void *ok = NULL;
    REQUIRE(pthread_create(&t, NULL, last_error_fail_in_thread, NULL) == 0);
    pthread_join(t, &ok);
    CHECK(ok != NULL);
    const char *again = fq_last_error();
    CHECK(again != NULL && again[0] != '\0');
}

static json_t *body_finish_on_block_handle(fq_op *op, void *userdata) {
    rec *r = userdata;
    json_t *v = json_object();
    json_incref(v); /* we hold 2 references, the call steals one */
    r->tag = fq_op_finish(op, v, NULL);
    if (v->refcount != 1)
        FAILF("fq_op_finish(block op) must release the stolen value: refcount %zu, want 1",
              v->refcount);
    json_decref(v);
    atomic_fetch_add(&r->body_runs, 1);
    return json_pack("{s:b}", "ran", 1);
}

TEST(null_handles_and_unknown_ids) {
    /* every function with NULL handles: documented status, no crash */
    CHECK_EQ_INT(fq_engine_free(NULL), FQ_OK);
    CHECK_EQ_INT(fq_engine_wait_idle(NULL, 0), FQ_ERR_INVALID);
    CHECK(fq_engine_stats(NULL) == NULL);
    CHECK_EQ_INT(fq_engine_event_fd(NULL), -1);
    CHECK_EQ_INT(fq_engine_dispatch(NULL, 0), FQ_ERR_INVALID);
    CHECK(fq_queue_new(NULL, "q", 1) == NULL);
    CHECK(fq_last_error()[0] != '\0');
    fq_queue_free(NULL);
    CHECK_EQ_INT(fq_queue_set_max_concurrent(NULL, 2), FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_queue_set_suspended(NULL, true), FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_queue_cancel_all(NULL), FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_queue_wait(NULL, 0), FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_submit_block(NULL, body_tag, NULL, rec_done, NULL), FQ_ERR_INVALID);
    CHECK(fq_last_error()[0] != '\0');
    CHECK_EQ_INT(fq_submit_async(NULL, body_async_capture, NULL, rec_done, NULL),
                 FQ_ERR_INVALID);
    CHECK(fq_op_get_id(NULL) <= 0);
    (void)fq_op_is_cancelled(NULL);
    CHECK_EQ_INT(fq_op_set_error(NULL, "x"), FQ_ERR_INVALID);
    json_t *v = json_object();
    json_incref(v);
    CHECK_EQ_INT(fq_op_finish(NULL, v, NULL), FQ_ERR_INVALID);
    if (!CHECK_EQ_INT(v->refcount, 1))
        FAILF("fq_op_finish(NULL, value) must release the STOLEN value");
    json_decref(v);
    CHECK(fq_op_dependency_result(NULL, 1) == NULL);
    CHECK_EQ_INT(fq_cancel(NULL, 1), FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_state(NULL, 1), FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_wait(NULL, 1, 0), FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_cancel_group(NULL, "g"), FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_cancel_all(NULL), FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_set_priority(NULL, 1, 0), FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_add_dependency(NULL, 1, 2), FQ_ERR_INVALID);
    (void)fq_result_op_id(NULL);
    (void)fq_result_outcome(NULL);
    CHECK_EQ_INT(fq_result_status(NULL), FQ_ERR_INVALID);
    CHECK(fq_result_error(NULL) == NULL);
    CHECK(fq_result_value(NULL) == NULL);

    /* a real engine, NULL/unknown everything else */
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    CHECK_EQ_INT(fq_engine_event_fd(e), -1);          /* thread delivery */
    CHECK_EQ_INT(fq_engine_dispatch(e, 0), FQ_ERR_STATE); /* thread delivery */
    CHECK(fq_queue_new(e, NULL, 1) == NULL);
    CHECK(fq_last_error()[0] != '\0');
    rec r = {0};
    CHECK_EQ_INT(fq_submit_block(q, NULL, NULL, rec_done, &r), FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_submit_async(q, NULL, NULL, rec_done, &r), FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_cancel(e, 987654321), FQ_ERR_NOT_FOUND);
    CHECK(fq_last_error()[0] != '\0');
    int rc0 = fq_cancel(e, 0), rcm = fq_cancel(e, -5);
    if (!(rc0 == FQ_ERR_NOT_FOUND || rc0 == FQ_ERR_INVALID))
        FAILF("fq_cancel(e, 0) = %d, want NOT_FOUND or INVALID", rc0);
    if (!(rcm == FQ_ERR_NOT_FOUND || rcm == FQ_ERR_INVALID))
        FAILF("fq_cancel(e, -5) = %d, want NOT_FOUND or INVALID", rcm);
    CHECK_EQ_INT(fq_cancel_group(e, NULL), FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_cancel_group(e, "no-such-group"), 0);
    CHECK_EQ_INT(fq_set_priority(e, 987654321, 4), FQ_ERR_NOT_FOUND);
    CHECK_EQ_INT(fq_add_dependency(e, 987654321, 987654322), FQ_ERR_NOT_FOUND);
    CHECK_EQ_INT(fq_cancel_all(e), 0);
    CHECK_EQ_INT(fq_queue_cancel_all(q), 0);
    CHECK_EQ_INT(fq_queue_wait(q, 0), FQ_OK); /* nothing submitted */
    CHECK_EQ_INT(fq_engine_wait_idle(e, 0), FQ_OK);

    /* fq_op_finish on a block operation's handle: FQ_ERR_STATE, value released,
     * the block still completes with its own return value */
    rec b = {0};
    fq_op_id id = fq_submit_block(q, body_finish_on_block_handle, NULL, rec_done, &b);
    REQUIRE(id > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(b.tag, FQ_ERR_STATE);
    CHECK_EQ_INT(atomic_load(&b.calls), 1);
    CHECK_EQ_INT(b.outcome, FQ_SUCCEEDED);
    CHECK(json_is_true(json_object_get(b.value, "ran")));
    /* a finished operation is unknown to cancel / set_priority / add_dependency */
    CHECK_EQ_INT(fq_cancel(e, id), FQ_ERR_NOT_FOUND);
    CHECK_EQ_INT(fq_set_priority(e, id, 0), FQ_ERR_NOT_FOUND);
    rec_clear(&b);
    CHECK_EQ_INT(atomic_load(&r.calls), 0);
    fqt_engine_free(e);
}

/* ---------------------------------------------------------------- config */

static void expect_bad_config(const char *text, const char *key) {
    json_t *cfg = fqt_json(text);
    char errbuf[256];
    memset(errbuf, 'X', sizeof errbuf);
    fq_engine *e = fq_engine_new(cfg, errbuf, sizeof errbuf);
    if (e != NULL) {
        FAILF("fq_engine_new(%s) accepted a bad config", text);
        fq_engine_free(e);
    } else {
        if (!memchr(errbuf, '\0', sizeof errbuf))
            FAILF("fq_engine_new(%s): errbuf not NUL-terminated", text);
        else if (!strstr(errbuf, key))
            FAILF("fq_engine_new(%s): errbuf \"%s\" does not name \"%s\"", text, errbuf, key);
        const char *le = fq_last_error();
        if (!le || !strstr(le, key))
            FAILF("fq_engine_new(%s): fq_last_error \"%s\" does not name \"%s\"", text,
                  le ? le : "(null)", key);
        if (fq_last_status() != FQ_ERR_INVALID)
            FAILF("fq_engine_new(%s): fq_last_status %d, not FQ_ERR_INVALID", text, fq_last_status());
    }
    json_decref(cfg);
}

TEST(config_errors_name_the_key) {
    expect_bad_config("{\"bogus_key\": 1}", "bogus_key");
    expect_bad_config("{\"workers\": \"two\"}", "workers");
    expect_bad_config("{\"workers\": 0}", "workers");
    expect_bad_config("{\"workers\": 257}", "workers");
    expect_bad_config("{\"transfer_threads\": 0}", "transfer_threads");
    expect_bad_config("{\"transfer_threads\": 17}", "transfer_threads");
    expect_bad_config("{\"history_values\": -1}", "history_values");
    expect_bad_config("{\"delivery\": \"carrier-pigeon\"}", "delivery");
    expect_bad_config("{\"delivery\": 1}", "delivery");
    expect_bad_config("{\"aging_ms\": \"soon\"}", "aging_ms");
    expect_bad_config("{\"history\": -1}", "history");
    expect_bad_config("{\"history\": 1000001}", "history");
    expect_bad_config("{\"max_per_host\": 0}", "max_per_host");
    expect_bad_config("{\"verify_tls\": \"yes\"}", "verify_tls");
    expect_bad_config("{\"user_agent\": 5}", "user_agent");
    expect_bad_config("{\"max_wait_ms\": true}", "max_wait_ms");
    expect_bad_config("{\"search\": 7}", "search");
    expect_bad_config("{\"search\": {\"url\": 5}}", "url");
    expect_bad_config("{\"search\": {\"url\": \"http://x/?q={query}\", \"frobnicate\": 1}}",
                      "frobnicate");
    expect_bad_config("{\"search\": {\"url\": \"http://x/?q={query}\", \"order\": \"up\"}}",
                      "order");

    /* not an object */
    json_t *arr = json_array();
    char errbuf[128] = "";
    fq_engine *e = fq_engine_new(arr, errbuf, sizeof errbuf);
    CHECK(e == NULL);
    if (e) fq_engine_free(e);
    CHECK(errbuf[0] != '\0');
    json_decref(arr);

    /* a tiny errbuf is truncated and NUL-terminated; NULL errbuf is allowed */
    json_t *cfg = fqt_json("{\"a_rather_long_unknown_key_name\": 1}");
    char small[8];
    memset(small, 'X', sizeof small);
    e = fq_engine_new(cfg, small, sizeof small);
    CHECK(e == NULL);
    if (e) fq_engine_free(e);
    CHECK(memchr(small, '\0', sizeof small) != NULL);
    e = fq_engine_new(cfg, NULL, 0);
    CHECK(e == NULL);
    if (e) fq_engine_free(e);
    CHECK_CONTAINS(fq_last_error(), "a_rather_long_unknown_key_name");
    json_decref(cfg);
}

TEST(config_every_documented_key_accepted) {
    fq_engine *e = fqt_engine(
        "{\"delivery\": \"thread\", \"workers\": 3, \"transfer_threads\": 3, \"aging_ms\": 500,"
        " \"history\": 100, \"history_values\": 8,"
        " \"max_per_host\": 4, \"connect_timeout_ms\": 5000, \"timeout_ms\": 0,"
        " \"max_wait_ms\": 0, \"max_redirects\": 0, \"max_response_bytes\": 1048576,"
        " \"max_json_depth\": 64, \"verify_tls\": false, \"user_agent\": \"fqtest/1\","
        " \"search\": {\"url\": \"http://127.0.0.1:9/s?q={query}\", \"results\": \"/items\","
        "  \"id\": \"/id\", \"sort\": \"/score\", \"order\": \"asc\"}}");
    fqt_engine_free(e);
    e = fqt_engine("{\"delivery\": \"poll\", \"workers\": 1, \"history\": 0, \"aging_ms\": 0}");
    fqt_engine_free(e);
    e = fqt_engine("{}");
    fqt_engine_free(e);
}

/* --------------------------------------------------------------- options */

static void expect_bad_options(fq_engine *e, fq_queue *q, const char *text,
                               const char *key) {
    rec r = {0};
    json_t *o = fqt_json(text);
    fq_op_id id = fq_submit_block(q, body_tag, o, rec_done, &r);
    if (id != FQ_ERR_INVALID)
        FAILF("submit_block(options %s) = %lld, want FQ_ERR_INVALID", text, (long long)id);
    else if (key && !strstr(fq_last_error(), key))
        FAILF("submit_block(options %s): fq_last_error \"%s\" does not name \"%s\"", text,
              fq_last_error(), key);
    rec ra = {0};
    fq_op_id ida = fq_submit_async(q, body_async_capture, o, rec_done, &ra);
    if (ida != FQ_ERR_INVALID)
        FAILF("submit_async(options %s) = %lld, want FQ_ERR_INVALID", text, (long long)ida);
    json_decref(o);
    if (ida > 0) { /* wrongly accepted: do not leave the async op unfinished */
        if (WAIT_UNTIL(atomic_load(&ra.op) != NULL, FQT_LONG_MS))
            fq_op_finish(atomic_load(&ra.op), NULL, NULL);
    }
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    if (id < 0 && (atomic_load(&r.calls) || atomic_load(&r.body_runs)))
        FAILF("options %s: a rejected block submit ran its body or callback", text);
    if (ida < 0 && (atomic_load(&ra.calls) || atomic_load(&ra.body_runs)))
        FAILF("options %s: a rejected async submit ran its body or callback", text);
    rec_clear(&r);
    rec_clear(&ra);
}

TEST(option_errors_reject_submit) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    expect_bad_options(e, q, "{\"bogus_option\": 1}", "bogus_option");
    expect_bad_options(e, q, "{\"priority\": 3}", "priority");
    expect_bad_options(e, q, "{\"priority\": 100}", "priority");
    expect_bad_options(e, q, "{\"priority\": \"urgent\"}", "priority");
    expect_bad_options(e, q, "{\"priority\": true}", "priority");
    expect_bad_options(e, q, "{\"qos\": \"fast\"}", "qos");
    expect_bad_options(e, q, "{\"qos\": 3}", "qos");
    expect_bad_options(e, q, "{\"group\": 5}", "group");
    expect_bad_options(e, q, "{\"depends_on\": 5}", "depends_on");
    expect_bad_options(e, q, "{\"depends_on\": [\"x\"]}", "depends_on");
    expect_bad_options(e, q, "{\"barrier\": \"yes\"}", "barrier");
    expect_bad_options(e, q, "{\"max_wait_ms\": \"1s\"}", "max_wait_ms");
    expect_bad_options(e, q, "[1, 2]", NULL);
    expect_bad_options(e, q, "\"priority\"", NULL);

    /* every documented option, valid, is accepted */
    static const char *good[] = {
        "{}",
        "{\"priority\": -8}", "{\"priority\": -4}", "{\"priority\": 0}",
        "{\"priority\": 4}", "{\"priority\": 8}",
        "{\"priority\": \"very-low\"}", "{\"priority\": \"low\"}",
        "{\"priority\": \"normal\"}", "{\"priority\": \"high\"}",
        "{\"priority\": \"very-high\"}",
        "{\"qos\": \"user-interactive\"}", "{\"qos\": \"user-initiated\"}",
        "{\"qos\": \"default\"}", "{\"qos\": \"utility\"}", "{\"qos\": \"background\"}",
        "{\"group\": \"g\", \"depends_on\": [], \"barrier\": false, \"max_wait_ms\": 60000}",
        "{\"barrier\": true}",
    };
    enum { NG = sizeof good / sizeof good[0] };
    rec r[NG];
    memset(r, 0, sizeof r);
    for (int i = 0; i < NG; i++) {
        r[i].tag = i;
        fq_op_id id = fqt_block(q, body_tag, good[i], rec_done, &r[i]);
        if (id <= 0)
            FAILF("options %s rejected: %lld (%s)", good[i], (long long)id, fq_last_error());
    }
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < NG; i++) {
        CHECK_EQ_INT(atomic_load(&r[i].calls), 1);
        CHECK_EQ_INT(r[i].outcome, FQ_SUCCEEDED);
        CHECK_EQ_INT(fqt_int(r[i].value, "tag", -1), i);
    }
    rec_clear_all(r, NG);
    fqt_engine_free(e);
}

TEST(queue_argument_errors) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "dup", 1);
    CHECK(fq_queue_new(e, "dup", 1) == NULL); /* names are unique */
    CHECK(fq_last_error()[0] != '\0');
    CHECK(fq_queue_new(e, "zero", 0) == NULL);
    CHECK(fq_queue_new(e, "neg", -3) == NULL);
    CHECK_EQ_INT(fq_queue_set_max_concurrent(q, 0), FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_queue_set_max_concurrent(q, -1), FQ_ERR_INVALID);
    CHECK_OK(fq_queue_set_max_concurrent(q, 5));
    CHECK_EQ_INT(fqt_qstat(e, "dup", "max_concurrent", -1), 5);
    fq_queue_free(q);
    /* the name is free again once the queue is released */
    fq_queue *q2 = fq_queue_new(e, "dup", 1);
    CHECK(q2 != NULL);
    fqt_engine_free(e);
}

/* ----------------------------------------------------------------- stats */

static const char *engine_keys[] = {"submitted", "succeeded", "failed", "cancelled",
                                    "queued", "running", "undelivered"};
static const char *queue_keys[] = {"max_concurrent", "queued", "running", "submitted",
                                   "succeeded", "failed", "cancelled"};

static json_t *body_fail(fq_op *op, void *userdata) {
    (void)userdata;
    fq_op_set_error(op, "planned failure");
    return NULL;
}

TEST(stats_json_shape) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *a = fqt_queue(e, "alpha", 2);
    fq_queue *b = fqt_queue(e, "beta", 3);
    CHECK_OK(fq_queue_set_suspended(b, true));
    rec r[6];
    memset(r, 0, sizeof r);
    CHECK(fqt_block(a, body_tag, NULL, rec_done, &r[0]) > 0);
    CHECK(fqt_block(a, body_fail, NULL, rec_done, &r[1]) > 0);
    CHECK(fqt_block(b, body_tag, NULL, rec_done, &r[2]) > 0);
    CHECK(fqt_block(b, body_tag, NULL, rec_done, &r[3]) > 0);
    fq_op_id c = fqt_block(b, body_tag, NULL, rec_done, &r[4]);
    CHECK(c > 0);
    CHECK_OK(fq_queue_wait(a, FQT_LONG_MS));
    CHECK_OK(fq_cancel(e, c));

    json_t *s = fq_engine_stats(e);
    REQUIRE(json_is_object(s));
    for (size_t i = 0; i < sizeof engine_keys / sizeof *engine_keys; i++)
        if (!json_is_integer(json_object_get(s, engine_keys[i])))
            FAILF("stats lacks integer \"%s\"", engine_keys[i]);
    json_t *qs = json_object_get(s, "queues");
    REQUIRE(json_is_object(qs));
    CHECK_EQ_INT(json_object_size(qs), 2);
    const char *names[] = {"alpha", "beta"};
    for (int k = 0; k < 2; k++) {
        json_t *qo = json_object_get(qs, names[k]);
        if (!json_is_object(qo)) {
            FAILF("stats.queues lacks \"%s\"", names[k]);
            continue;
        }
        for (size_t i = 0; i < sizeof queue_keys / sizeof *queue_keys; i++)
            if (!json_is_integer(json_object_get(qo, queue_keys[i])))
                FAILF("stats.queues.%s lacks integer \"%s\"", names[k], queue_keys[i]);
        if (!json_is_boolean(json_object_get(qo, "suspended")))
            FAILF("stats.queues.%s lacks boolean \"suspended\"", names[k]);
    }
    json_t *qa = json_object_get(qs, "alpha"), *qb = json_object_get(qs, "beta");
    CHECK_EQ_INT(fqt_int(qa, "max_concurrent", -1), 2);
    CHECK_EQ_INT(fqt_int(qb, "max_concurrent", -1), 3);
    CHECK(json_is_false(json_object_get(qa, "suspended")));
    CHECK(json_is_true(json_object_get(qb, "suspended")));
    CHECK_EQ_INT(fqt_int(qa, "submitted", -1), 2);
    CHECK_EQ_INT(fqt_int(qa, "succeeded", -1), 1);
    CHECK_EQ_INT(fqt_int(qa, "failed", -1), 1);
    CHECK_EQ_INT(fqt_int(qa, "queued", -1), 0);
    CHECK_EQ_INT(fqt_int(qb, "submitted", -1), 3);
    CHECK_EQ_INT(fqt_int(qb, "queued", -1), 2);
    CHECK_EQ_INT(fqt_int(qb, "running", -1), 0);
    CHECK_EQ_INT(fqt_int(qb, "cancelled", -1), 1);
    CHECK_EQ_INT(fqt_int(s, "submitted", -1), 5);
    CHECK_EQ_INT(fqt_int(s, "succeeded", -1), 1);
    CHECK_EQ_INT(fqt_int(s, "failed", -1), 1);
    CHECK_EQ_INT(fqt_int(s, "cancelled", -1), 1);
    CHECK_EQ_INT(fqt_int(s, "queued", -1), 2);
    CHECK_EQ_INT(fqt_int(s, "running", -1), 0);
    json_decref(s);

    CHECK_OK(fq_queue_set_suspended(b, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    s = fq_engine_stats(e);
    CHECK_EQ_INT(fqt_int(s, "submitted", -1), 5);
    CHECK_EQ_INT(fqt_int(s, "succeeded", -1), 3);
    CHECK_EQ_INT(fqt_int(s, "queued", -1), 0);
    CHECK_EQ_INT(fqt_int(s, "undelivered", -1), 0);
    /* a NEW reference: ours to keep and change */
    CHECK_EQ_INT(s->refcount, 1);
    json_decref(s);
    CHECK_EQ_INT(r[1].outcome, FQ_FAILED);
    CHECK_EQ_INT(r[1].status, FQ_ERR_OPERATION);
    CHECK_CONTAINS(r[1].error, "planned failure");
    CHECK(r[1].value == NULL);
    CHECK(r[0].has_error == false);
    rec_clear_all(r, 6);
    fqt_engine_free(e);
}
