/* The network part of the API seen from the engine core: NULL handles, and
 * what the HTTP accessors give for a block operation ("other operations give
 * 0 / NULL"). The functions are referenced weakly so that the harness still
 * links while the header is ahead of the library; a missing one is a failure
 * here (and in check_exports.sh). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <string.h>

#include "fqt.h"

#pragma weak fq_submit_request
#pragma weak fq_submit_search
#pragma weak fq_engine_set_event_fn
#pragma weak fq_event_op_id
#pragma weak fq_event_get_type
#pragma weak fq_event_progress
#pragma weak fq_result_http_status
#pragma weak fq_result_headers
#pragma weak fq_result_body
#pragma weak fq_result_metrics

#define PRESENT(fn) ((void *)(fn) != NULL ? true : (FAILF("%s is not exported", #fn), false))

TEST(network_api_null_handles) {
    json_t *req = fqt_json("{\"url\": \"http://127.0.0.1:9/\"}");
    rec r = {0};
    if (PRESENT(fq_submit_request)) {
        CHECK_EQ_INT(fq_submit_request(NULL, req, NULL, rec_done, &r), FQ_ERR_INVALID);
        CHECK(fq_last_error()[0] != '\0');
    }
    if (PRESENT(fq_submit_search))
        CHECK_EQ_INT(fq_submit_search(NULL, "q", NULL, rec_done, &r), FQ_ERR_INVALID);
    if (PRESENT(fq_engine_set_event_fn))
        CHECK_EQ_INT(fq_engine_set_event_fn(NULL, NULL, NULL), FQ_ERR_INVALID);
    if (PRESENT(fq_event_op_id)) CHECK(fq_event_op_id(NULL) <= 0);
    if (PRESENT(fq_event_get_type)) (void)fq_event_get_type(NULL);
    if (PRESENT(fq_event_progress)) {
        uint64_t a = 7, b = 7;
        CHECK_EQ_INT(fq_event_progress(NULL, &a, &b), FQ_ERR_INVALID);
    }
    if (PRESENT(fq_result_http_status)) CHECK_EQ_INT(fq_result_http_status(NULL), 0);
    if (PRESENT(fq_result_headers)) CHECK(fq_result_headers(NULL) == NULL);
    if (PRESENT(fq_result_body)) {
        size_t len = 99;
        CHECK(fq_result_body(NULL, &len) == NULL);
        CHECK_EQ_INT(len, 0);
        CHECK(fq_result_body(NULL, NULL) == NULL);
    }
    if (PRESENT(fq_result_metrics)) CHECK(fq_result_metrics(NULL) == NULL);

    /* a real queue, bad requests: rejected, never called back */
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    if (fq_submit_request) {
        CHECK_EQ_INT(fq_submit_request(q, NULL, NULL, rec_done, &r), FQ_ERR_INVALID);
        json_t *bad = fqt_json("{\"url\": \"ftp://127.0.0.1/\"}");
        CHECK_EQ_INT(fq_submit_request(q, bad, NULL, rec_done, &r), FQ_ERR_INVALID);
        json_decref(bad);
        bad = fqt_json("{\"method\": \"GET\"}"); /* "url" is required */
        CHECK_EQ_INT(fq_submit_request(q, bad, NULL, rec_done, &r), FQ_ERR_INVALID);
        json_decref(bad);
        bad = fqt_json("{\"url\": \"http://127.0.0.1:9/\", \"bogus_field\": 1}");
        CHECK_EQ_INT(fq_submit_request(q, bad, NULL, rec_done, &r), FQ_ERR_INVALID);
        CHECK_CONTAINS(fq_last_error(), "bogus_field");
        json_decref(bad);
    }
    if (fq_submit_search) {
        CHECK_EQ_INT(fq_submit_search(q, NULL, NULL, rec_done, &r), FQ_ERR_INVALID);
        /* no engine "search" config and no "url" option */
        CHECK_EQ_INT(fq_submit_search(q, "q", NULL, rec_done, &r), FQ_ERR_INVALID);
    }
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&r.calls), 0);
    json_decref(req);
    fqt_engine_free(e);
}

typedef struct {
    rec self; /* first: body_tag and rec_done see the userdata as a rec */
    long http_status;
    bool headers_null, body_null, metrics_null;
    size_t body_len;
} http_view;

static void http_view_done(const fq_result *res, void *userdata) {
    http_view *v = userdata;
    v->http_status = fq_result_http_status ? fq_result_http_status(res) : -1;
    v->headers_null = fq_result_headers ? fq_result_headers(res) == NULL : false;
    v->body_len = 99;
    v->body_null = fq_result_body ? fq_result_body(res, &v->body_len) == NULL : false;
    v->metrics_null = fq_result_metrics ? fq_result_metrics(res) == NULL : false;
    rec_done(res, &v->self);
}

TEST(network_accessors_on_a_block_result) {
    if (!PRESENT(fq_result_http_status) || !PRESENT(fq_result_headers) ||
        !PRESENT(fq_result_body) || !PRESENT(fq_result_metrics))
        return;
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    http_view v;
    memset(&v, 0, sizeof v);
    REQUIRE(fqt_block(q, body_tag, NULL, http_view_done, &v) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&v.self.calls), 1);
    CHECK_EQ_INT(v.self.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(v.http_status, 0);
    CHECK(v.headers_null);
    CHECK(v.body_null);
    CHECK_EQ_INT(v.body_len, 0);
    CHECK(v.metrics_null);
    rec_clear(&v.self);
    fqt_engine_free(e);
}
