/* Requests through the engine against the shared test server
 * (Tests/support/testserver.py): methods, headers, query encoding, bodies,
 * the result accessors, status handling, per-host and queue concurrency seen
 * from the server, priority order, cancellation, every kind of time limit,
 * redirects, the size cap, submit-time rejection, progress events and the
 * JSONTestSuite files over HTTP.
 *
 * Each test starts its own server (fqt_server_start, see fqt.h) and stops it
 * at its end; the server's /stats is read over a plain socket (fqt_http_get),
 * so asking never goes through — or waits behind — the engine under test. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fqt.h"

#define URL(s, path) fqt_url((s), (path), url_buf_, sizeof url_buf_)

static bool str_eq(const json_t *j, const char *s) {
    return json_is_string(j) && strcmp(json_string_value(j), s) == 0;
}

/* CHECKs that obj[key] is the string want. */
#define CHECK_JSTR(obj, key, want)                                                    \
    do {                                                                               \
        json_t *v_ = json_object_get((obj), (key));                                    \
        if (!str_eq(v_, (want))) {                                                     \
            char *d_ = v_ ? json_dumps(v_, JSON_ENCODE_ANY) : NULL;                    \
            FAILF("%s[\"%s\"] is %s, expected \"%s\"", #obj, (key), d_ ? d_ : "absent", \
                  (want));                                                             \
            free(d_);                                                                  \
        }                                                                              \
    } while (0)

static void check_json_eq(const json_t *got, const char *want_text, const char *what) {
    json_t *want = fqt_json(want_text);
    if (!json_equal((json_t *)got, want)) {
        char *g = got ? json_dumps(got, JSON_ENCODE_ANY | JSON_SORT_KEYS) : NULL;
        FAILF("%s: got %s, expected %s", what, g ? g : "NULL", want_text);
        free(g);
    }
    json_decref(want);
}

/* The echoed request body (a string in the /echo document), parsed and
 * compared with `want_text`. */
static void check_sent_json(const json_t *echo, const char *want_text, const char *what) {
    const char *sent = json_string_value(json_object_get(echo, "body"));
    json_t *parsed = sent ? json_loads(sent, 0, NULL) : NULL;
    check_json_eq(parsed, want_text, what);
    json_decref(parsed);
}

/* Submits {"method": m, "url": url} (m may be NULL) with options text. */
static fq_op_id submit_url(fq_queue *q, const char *method, const char *url,
                           const char *options_text, netrec *n) {
    json_t *req = method ? json_pack("{s:s, s:s}", "method", method, "url", url)
                         : json_pack("{s:s}", "url", url);
    json_t *opt = options_text ? fqt_json(options_text) : NULL;
    fq_op_id id = fq_submit_request(q, req, opt, net_done, n);
    if (id <= 0) FAILF("submit %s %s failed: %lld %s", method ? method : "GET", url,
                       (long long)id, fq_last_error());
    json_decref(req);
    json_decref(opt);
    return id;
}

/* One request, waited for; REQUIREs that the callback ran exactly once. */
static void fetch(fq_engine *e, fq_queue *q, const char *method, const char *url,
                  const char *options_text, netrec *n) {
    memset(n, 0, sizeof *n);
    REQUIRE(submit_url(q, method, url, options_text, n) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    REQUIRE(atomic_load(&n->r.calls) == 1);
}

static void expect(const netrec *n, int outcome, int status, const char *what) {
    if (n->r.outcome != outcome || n->r.status != status)
        FAILF("%s: outcome %d status %d (%s), expected outcome %d status %d (%s); error: %s",
              what, n->r.outcome, n->r.status, fq_strerror(n->r.status), outcome, status,
              fq_strerror(status), n->r.error);
}

/* ------------------------------------------------------------------ */

/* The engine's connections are close-on-exec: a child the application
 * spawns does not inherit them (and keep them open on the server after the
 * engine closed them). Checked on a kept-alive connection after a GET. */
TEST(http_connections_are_close_on_exec) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    char url[256];
    snprintf(url, sizeof url, "%s/json?size=10", s.base);
    netrec n;
    fetch(e, q, NULL, url, NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "GET");
    int inet = 0;
    for (int fd = 3; fd < 4096; fd++) {
        int flags = fcntl(fd, F_GETFD);
        int domain = 0;
        socklen_t len = sizeof domain;
        if (flags < 0 || getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0) continue;
        if (domain != AF_INET && domain != AF_INET6) continue;
        inet++;
        if (!(flags & FD_CLOEXEC)) FAILF("fd %d (an IP socket) is not close-on-exec", fd);
    }
    CHECK(inet >= 1); /* the kept-alive connection (and the test server's own, if any) */
    netrec_clear(&n);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

TEST(http_methods_headers_query_echo) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 3);
    char url_buf_[256];
    const char *methods[] = {"GET", "POST", "PUT", "DELETE", "PATCH", "PURGE"};
    enum { NM = 6 };
    netrec n[NM];
    memset(n, 0, sizeof n);
    for (int i = 0; i < NM; i++) {
        json_t *req = json_pack(
            "{s:s, s:s, s:{s:s, s:s}, s:{s:s, s:i, s:b, s:s, s:s}}", "method", methods[i],
            "url", URL(&s, "/echo"), "headers", "X-Fetchq-Test", methods[i], "X-Two",
            "a b\tc", "query", "a b&c", "1+1=2 ~-._ é#%/?", "n", 42, "t", 1, "m", methods[i],
            "empty", "");
        REQUIRE(req != NULL);
        CHECK(fq_submit_request(q, req, NULL, net_done, &n[i]) > 0);
        json_decref(req);
    }
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < NM; i++) {
        const char *m = methods[i];
        CHECK_EQ_INT(atomic_load(&n[i].r.calls), 1);
        expect(&n[i], FQ_SUCCEEDED, FQ_OK, m);
        CHECK(!n[i].r.has_error);
        CHECK_EQ_INT(n[i].http_status, 200);
        json_t *v = n[i].r.value;
        REQUIRE(json_is_object(v));
        CHECK_JSTR(v, "method", m);
        CHECK_JSTR(v, "path", "/echo");
        CHECK_JSTR(v, "body", "");
        char want[512];
        snprintf(want, sizeof want,
                 "{\"a b&c\": \"1+1=2 ~-._ \\u00e9#%%/?\", \"n\": \"42\", \"t\": \"true\", "
                 "\"m\": \"%s\", \"empty\": \"\"}",
                 m);
        check_json_eq(json_object_get(v, "query"), want, m);
        json_t *h = json_object_get(v, "headers");
        CHECK_JSTR(h, "x-fetchq-test", m);
        CHECK_JSTR(h, "x-two", "a b\tc");
        CHECK_JSTR(h, "user-agent", "fetchq/" FQ_VERSION_STRING);
        char host[64];
        snprintf(host, sizeof host, "127.0.0.1:%d", s.port);
        CHECK_JSTR(h, "host", host);
    }
    /* The raw request targets: RFC 3986 encoding (%20 never '+', unreserved
     * characters kept, uppercase hex), one parameter per key, any order. */
    json_t *st = fqt_server_stats(&s);
    json_t *arr = json_object_get(st, "arrivals");
    CHECK_EQ_INT(json_array_size(arr), NM);
    CHECK_EQ_INT(fqt_int(st, "requests", -1), NM);
    for (size_t k = 0; k < json_array_size(arr); k++) {
        const char *t = json_string_value(json_array_get(arr, k));
        REQUIRE(t != NULL);
        if (strncmp(t, "/echo?", 6) != 0) {
            FAILF("arrival %s does not start with /echo?", t);
            continue;
        }
        char params[1024];
        snprintf(params, sizeof params, "%s", t + 6);
        int found = 0, mcount = 0;
        char *save = NULL;
        for (char *p = strtok_r(params, "&", &save); p; p = strtok_r(NULL, "&", &save)) {
            if (strcmp(p, "a%20b%26c=1%2B1%3D2%20~-._%20%C3%A9%23%25%2F%3F") == 0 ||
                strcmp(p, "n=42") == 0 || strcmp(p, "t=true") == 0 ||
                strcmp(p, "empty=") == 0) {
                found++;
            } else if (strncmp(p, "m=", 2) == 0) {
                mcount++;
            } else {
                FAILF("unexpected query parameter %s in %s", p, t);
            }
        }
        CHECK_EQ_INT(found, 4);
        CHECK_EQ_INT(mcount, 1);
    }
    json_decref(st);
    for (int i = 0; i < NM; i++) netrec_clear(&n[i]);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

TEST(http_request_bodies) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    char url_buf_[256];
    enum { NB = 6 };
    netrec n[NB];
    memset(n, 0, sizeof n);
    const char *json_body = "{\"k\": [1, \"two\", null, true, 2.5], \"u\": \"\\u00e9\\n\"}";
    const char *str_body = "hello\r\nworld \xc3\xa9 {not json";
    json_t *reqs[NB];
    /* 0: JSON object body -> serialized, application/json */
    reqs[0] = json_pack("{s:s, s:s, s:o}", "method", "POST", "url", URL(&s, "/echo"), "body",
                        fqt_json(json_body));
    /* 1: string body -> as is */
    reqs[1] = json_pack("{s:s, s:s, s:s}", "method", "PUT", "url", URL(&s, "/echo"), "body",
                        str_body);
    /* 2: JSON body with the caller's own Content-Type (any case) */
    reqs[2] = json_pack("{s:s, s:s, s:{s:s}, s:o}", "method", "PATCH", "url",
                        URL(&s, "/echo"), "headers", "content-TYPE",
                        "application/vnd.test+json", "body", fqt_json("[1, 2, 3]"));
    /* 3: a JSON array body */
    reqs[3] = json_pack("{s:s, s:s, s:o}", "method", "POST", "url", URL(&s, "/echo"), "body",
                        fqt_json("[{\"a\": {}}, []]"));
    /* 4: a JSON number body */
    reqs[4] = json_pack("{s:s, s:s, s:i}", "method", "POST", "url", URL(&s, "/echo"), "body",
                        7);
    /* 5: option user_agent */
    reqs[5] = json_pack("{s:s}", "url", URL(&s, "/echo"));
    for (int i = 0; i < NB; i++) {
        REQUIRE(reqs[i] != NULL);
        json_t *opt = i == 5 ? fqt_json("{\"user_agent\": \"custom-agent/9 (x)\"}") : NULL;
        CHECK(fq_submit_request(q, reqs[i], opt, net_done, &n[i]) > 0);
        json_decref(opt);
        json_decref(reqs[i]);
    }
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < NB; i++) {
        CHECK_EQ_INT(atomic_load(&n[i].r.calls), 1);
        expect(&n[i], FQ_SUCCEEDED, FQ_OK, "body request");
        REQUIRE(json_is_object(n[i].r.value));
    }
    json_t *v, *h;
    char len[32];

    v = n[0].r.value;
    h = json_object_get(v, "headers");
    CHECK_JSTR(v, "method", "POST");
    CHECK_JSTR(h, "content-type", "application/json");
    const char *sent = json_string_value(json_object_get(v, "body"));
    REQUIRE(sent != NULL);
    json_t *parsed = json_loads(sent, 0, NULL);
    CHECK(parsed != NULL);
    check_json_eq(parsed, json_body, "the serialized JSON body");
    json_decref(parsed);
    snprintf(len, sizeof len, "%zu", strlen(sent));
    CHECK_JSTR(h, "content-length", len);

    v = n[1].r.value;
    h = json_object_get(v, "headers");
    CHECK_JSTR(v, "method", "PUT");
    CHECK_JSTR(v, "body", str_body);
    snprintf(len, sizeof len, "%zu", strlen(str_body));
    CHECK_JSTR(h, "content-length", len);
    if (str_eq(json_object_get(h, "content-type"), "application/json"))
        FAILF("a string body was sent with Content-Type: application/json");

    v = n[2].r.value;
    h = json_object_get(v, "headers");
    CHECK_JSTR(h, "content-type", "application/vnd.test+json");
    check_sent_json(v, "[1, 2, 3]", "the PATCH body");

    v = n[3].r.value;
    h = json_object_get(v, "headers");
    CHECK_JSTR(h, "content-type", "application/json");
    check_sent_json(v, "[{\"a\": {}}, []]", "the array body");

    v = n[4].r.value;
    h = json_object_get(v, "headers");
    CHECK_JSTR(h, "content-type", "application/json");
    CHECK_JSTR(v, "body", "7");

    v = n[5].r.value;
    h = json_object_get(v, "headers");
    CHECK_JSTR(v, "method", "GET");
    CHECK_JSTR(h, "user-agent", "custom-agent/9 (x)");
    CHECK_JSTR(v, "body", "");

    for (int i = 0; i < NB; i++) netrec_clear(&n[i]);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

static const char *const metric_numbers[] = {"queue_wait_ms", "connect_ms", "first_byte_ms",
                                             "total_ms"};
static const char *const metric_integers[] = {"bytes", "redirects", "attempts"};

static void check_metrics(const netrec *n, long long bytes, long long redirects) {
    json_t *m = n->metrics;
    REQUIRE(json_is_object(m));
    CHECK_EQ_INT(json_object_size(m), 10);
    for (size_t i = 0; i < 4; i++) {
        json_t *x = json_object_get(m, metric_numbers[i]);
        if (!json_is_number(x)) FAILF("metrics[%s] is not a number", metric_numbers[i]);
        else if (json_number_value(x) < 0) FAILF("metrics[%s] < 0", metric_numbers[i]);
    }
    for (size_t i = 0; i < 3; i++)
        if (!json_is_integer(json_object_get(m, metric_integers[i])))
            FAILF("metrics[%s] is not an integer", metric_integers[i]);
    CHECK(json_is_string(json_object_get(m, "http_version")));
    CHECK(json_is_boolean(json_object_get(m, "reused_connection")));
    /* nothing the test server sends here is cacheable */
    CHECK(json_is_false(json_object_get(m, "from_cache")));
    CHECK(!n->from_cache);
    CHECK_EQ_INT(fqt_int(m, "bytes", -1), bytes);
    CHECK_EQ_INT(fqt_int(m, "redirects", -1), redirects);
    CHECK_EQ_INT(fqt_int(m, "attempts", -1), 1);
    CHECK_JSTR(m, "http_version", "1.1");
    CHECK(json_number_value(json_object_get(m, "total_ms")) >=
          json_number_value(json_object_get(m, "first_byte_ms")));
}

TEST(http_result_accessors_and_parse_modes) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    char url_buf_[256];
    netrec n;

    /* parse "auto" (the default) on a JSON response */
    fetch(e, q, NULL, URL(&s, "/json?size=200"), NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "/json");
    CHECK_EQ_INT(n.http_status, 200);
    REQUIRE(n.body != NULL);
    CHECK(n.body_len >= 200 && n.body_len < 300);
    REQUIRE(json_is_object(n.headers));
    const char *key;
    json_t *val;
    json_object_foreach(n.headers, key, val) {
        for (const char *c = key; *c; c++)
            if (isupper((unsigned char)*c)) {
                FAILF("header name %s is not lower-cased", key);
                break;
            }
        if (!json_is_string(val)) FAILF("header %s is not a string", key);
    }
    CHECK_JSTR(n.headers, "content-type", "application/json");
    CHECK_JSTR(n.headers, "server", "fetchq-testserver");
    char len[32];
    snprintf(len, sizeof len, "%zu", n.body_len);
    CHECK_JSTR(n.headers, "content-length", len);
    json_t *from_body = json_loadb((const char *)n.body, n.body_len, 0, NULL);
    CHECK(from_body != NULL);
    CHECK(json_is_object(n.r.value));
    CHECK(json_equal(from_body, n.r.value));
    CHECK(json_is_array(json_object_get(n.r.value, "items")));
    json_decref(from_body);
    check_metrics(&n, (long long)n.body_len, 0);
    netrec_clear(&n);

    /* a second request on the same engine reuses the keep-alive connection */
    fetch(e, q, NULL, URL(&s, "/json?size=10"), NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "/json again");
    CHECK(json_is_true(json_object_get(n.metrics, "reused_connection")));
    CHECK_EQ_INT(fqt_server_stat(&s, "connections_total"), 1);
    netrec_clear(&n);

    /* parse "none": no value, the body is still there */
    fetch(e, q, NULL, URL(&s, "/json?size=200"), "{\"parse\": \"none\"}", &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "parse none");
    CHECK(n.r.value == NULL);
    CHECK(n.body != NULL && n.body_len >= 200);
    from_body = n.body ? json_loadb((const char *)n.body, n.body_len, 0, NULL) : NULL;
    CHECK(json_is_object(from_body));
    json_decref(from_body);
    netrec_clear(&n);

    /* parse "auto" on a non-JSON response: no value */
    fetch(e, q, NULL, URL(&s, "/bytes?n=300"), NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "auto on octet-stream");
    CHECK(n.r.value == NULL);
    CHECK_EQ_INT(n.body_len, 300);
    CHECK_JSTR(n.headers, "content-type", "application/octet-stream");
    bool pattern_ok = n.body != NULL;
    for (size_t i = 0; pattern_ok && i < n.body_len; i++)
        if (n.body[i] != (unsigned char)(i % 251)) pattern_ok = false;
    CHECK(pattern_ok);
    check_metrics(&n, 300, 0);
    netrec_clear(&n);

    /* parse "json" on the same bytes: FQ_ERR_PARSE, body kept */
    fetch(e, q, NULL, URL(&s, "/bytes?n=300"), "{\"parse\": \"json\"}", &n);
    expect(&n, FQ_FAILED, FQ_ERR_PARSE, "json on octet-stream");
    CHECK_EQ_INT(n.http_status, 200);
    CHECK_EQ_INT(n.body_len, 300);
    CHECK(n.r.has_error);
    netrec_clear(&n);

    /* 204: no body */
    fetch(e, q, NULL, URL(&s, "/204"), NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "/204");
    CHECK_EQ_INT(n.http_status, 204);
    CHECK(n.body == NULL);
    CHECK_EQ_INT(n.body_len, 0);
    CHECK(n.r.value == NULL);
    netrec_clear(&n);

    fqt_engine_free(e);
    fqt_server_stop(&s);
}

TEST(http_status_not_accepted_and_accept_status) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 4);
    char url_buf_[256];
    netrec n;

    static const struct {
        const char *method, *path, *options;
        int outcome, status;
        long http;
    } cases[] = {
        {NULL, "/status/404", NULL, FQ_FAILED, FQ_ERR_HTTP, 404},
        {"POST", "/status/500", NULL, FQ_FAILED, FQ_ERR_HTTP, 500},
        {"DELETE", "/status/301", "{\"max_redirects\": 5}", FQ_FAILED, FQ_ERR_HTTP, 301},
        {NULL, "/status/201", NULL, FQ_SUCCEEDED, FQ_OK, 201},
        {NULL, "/status/404", "{\"accept_status\": [404]}", FQ_SUCCEEDED, FQ_OK, 404},
        {NULL, "/status/410", "{\"accept_status\": [404]}", FQ_FAILED, FQ_ERR_HTTP, 410},
        {NULL, "/status/404", "{\"accept_status\": [\"4xx\"]}", FQ_SUCCEEDED, FQ_OK, 404},
        {NULL, "/status/418", "{\"accept_status\": [\"4xx\"]}", FQ_SUCCEEDED, FQ_OK, 418},
        {NULL, "/status/500", "{\"accept_status\": [\"4xx\"]}", FQ_FAILED, FQ_ERR_HTTP, 500},
        {NULL, "/status/503", "{\"accept_status\": [404, \"5xx\"]}", FQ_SUCCEEDED, FQ_OK, 503},
        {"PURGE", "/status/599", "{\"accept_status\": [\"5xx\"]}", FQ_SUCCEEDED, FQ_OK, 599},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[128];
        snprintf(what, sizeof what, "%s %s %s", cases[i].method ? cases[i].method : "GET",
                 cases[i].path, cases[i].options ? cases[i].options : "");
        fetch(e, q, cases[i].method, URL(&s, cases[i].path), cases[i].options, &n);
        expect(&n, cases[i].outcome, cases[i].status, what);
        if (n.http_status != cases[i].http)
            FAILF("%s: http status %ld, expected %ld", what, n.http_status, cases[i].http);
        char want[64];
        snprintf(want, sizeof want, "{\"status\": %ld}", cases[i].http);
        /* the body and the parsed value stay readable, also on failure */
        if (!n.body || n.body_len != strlen(want) || memcmp(n.body, want, n.body_len) != 0)
            FAILF("%s: body %.*s, expected %s", what, (int)n.body_len,
                  n.body ? (const char *)n.body : "(null)", want);
        check_json_eq(n.r.value, want, what);
        CHECK_JSTR(n.headers, "content-type", "application/json");
        if (cases[i].outcome == FQ_FAILED) {
            CHECK(n.r.has_error);
        } else {
            CHECK(!n.r.has_error);
        }
        netrec_clear(&n);
    }
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* n requests to /delay?ms=ms spread over the queues; returns how many
 * succeeded. */
static int delay_burst(fq_engine *e, fq_queue **qs, int nq, int n, int ms,
                       const fqt_server *s) {
    netrec *r = calloc((size_t)n, sizeof *r);
    REQUIRE(r != NULL);
    char url[256];
    for (int i = 0; i < n; i++) {
        snprintf(url, sizeof url, "%s/delay?ms=%d&i=%d", s->base, ms, i);
        CHECK(submit_url(qs[i % nq], NULL, url, NULL, &r[i]) > 0);
    }
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    int ok = 0;
    for (int i = 0; i < n; i++) {
        CHECK_EQ_INT(atomic_load(&r[i].r.calls), 1);
        if (r[i].r.outcome == FQ_SUCCEEDED) ok++;
        else FAILF("delay request %d: outcome %d status %d %s", i, r[i].r.outcome,
                   r[i].r.status, r[i].r.error);
        netrec_clear(&r[i]);
    }
    free(r);
    return ok;
}

TEST(http_max_per_host_and_max_concurrent_seen_by_server) {
    fqt_server s;
    fqt_server_start(&s, NULL);

    /* the per-host limit: 3, on a queue that would allow 16 */
    fq_engine *e = fqt_engine("{\"max_per_host\": 3}");
    fq_queue *q = fqt_queue(e, "q", 16);
    fqt_server_reset(&s);
    CHECK_EQ_INT(delay_burst(e, &q, 1, 12, 150, &s), 12);
    json_t *st = fqt_server_stats(&s);
    CHECK_EQ_INT(fqt_int(st, "max_in_flight", -1), 3);
    CHECK_EQ_INT(fqt_int(st, "requests", -1), 12);
    json_decref(st);
    fqt_engine_free(e);

    /* the per-host limit holds across queues */
    e = fqt_engine("{\"max_per_host\": 3}");
    fq_queue *qs[2] = {fqt_queue(e, "a", 8), fqt_queue(e, "b", 8)};
    fqt_server_reset(&s);
    CHECK_EQ_INT(delay_burst(e, qs, 2, 12, 150, &s), 12);
    CHECK_EQ_INT(fqt_server_stat(&s, "max_in_flight"), 3);
    fqt_engine_free(e);

    /* the queue's max_concurrent: 5, with a per-host limit of 64 */
    e = fqt_engine("{\"max_per_host\": 64}");
    q = fqt_queue(e, "q", 5);
    fqt_server_reset(&s);
    CHECK_EQ_INT(delay_burst(e, &q, 1, 12, 150, &s), 12);
    st = fqt_server_stats(&s);
    CHECK_EQ_INT(fqt_int(st, "max_in_flight", -1), 5);
    CHECK_EQ_INT(fqt_int(st, "requests", -1), 12);
    json_decref(st);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

TEST(http_priority_order_in_server_arrivals) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine("{\"aging_ms\": 0}");
    fq_queue *q = fqt_queue(e, "q", 1);
    CHECK_OK(fq_queue_set_suspended(q, true));
    static const struct {
        const char *tag;
        const char *options;
    } subs[] = {
        {"a", "{\"priority\": \"low\"}"},       {"b", NULL},
        {"c", "{\"priority\": 4}"},             {"d", "{\"priority\": \"very-high\"}"},
        {"e", "{\"priority\": -8}"},            {"f", "{\"priority\": \"normal\"}"},
        {"g", "{\"priority\": \"high\"}"},      {"h", "{\"priority\": 8}"},
    };
    enum { NS = sizeof subs / sizeof subs[0] };
    const char *want[NS] = {"d", "h", "c", "g", "b", "f", "a", "e"};
    netrec n[NS];
    memset(n, 0, sizeof n);
    char url[256];
    for (int i = 0; i < NS; i++) {
        snprintf(url, sizeof url, "%s/echo?p=%s", s.base, subs[i].tag);
        CHECK(submit_url(q, NULL, url, subs[i].options, &n[i]) > 0);
    }
    fqt_sleep_ms(50);
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), 0);
    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < NS; i++) {
        CHECK_EQ_INT(atomic_load(&n[i].r.calls), 1);
        expect(&n[i], FQ_SUCCEEDED, FQ_OK, subs[i].tag);
        netrec_clear(&n[i]);
    }
    json_t *st = fqt_server_stats(&s);
    json_t *arr = json_object_get(st, "arrivals");
    CHECK_EQ_INT(json_array_size(arr), NS);
    for (size_t i = 0; i < NS && i < json_array_size(arr); i++) {
        char exp[32];
        snprintf(exp, sizeof exp, "/echo?p=%s", want[i]);
        const char *got = json_string_value(json_array_get(arr, i));
        if (!got || strcmp(got, exp) != 0) FAILF("arrival %zu: %s, expected %s", i, got, exp);
    }
    json_decref(st);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

TEST(http_cancel_in_flight_closes_the_connection) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    char url_buf_[256];
    netrec n;
    memset(&n, 0, sizeof n);
    fq_op_id id = submit_url(q, NULL, URL(&s, "/stall"), NULL, &n);
    REQUIRE(id > 0);
    bool arrived = WAIT_UNTIL(fqt_server_stat(&s, "in_flight") == 1, FQT_LONG_MS);
    REQUIRE(arrived);
    CHECK_EQ_INT(fqt_server_stat(&s, "open_connections"), 1);
    CHECK_EQ_INT(atomic_load(&n.r.calls), 0);
    long long t0 = fqt_now_ms();
    CHECK_OK(fq_cancel(e, id));
    bool called = WAIT_UNTIL(atomic_load(&n.r.calls) == 1, FQT_LONG_MS);
    REQUIRE(called);
    long long dt = fqt_now_ms() - t0;
    if (dt > 5000) FAILF("the cancelled request's callback came %lld ms after fq_cancel", dt);
    expect(&n, FQ_CANCELLED, FQ_ERR_CANCELLED, "cancelled /stall");
    CHECK_EQ_INT(n.r.id, id);
    CHECK(n.r.has_error);
    CHECK_EQ_INT(n.http_status, 0);
    bool closed = WAIT_UNTIL(fqt_server_stat(&s, "open_connections") == 0, 10000);
    if (!closed)
        FAILF("open_connections is %lld 10 s after the cancel (expected 0)",
              fqt_server_stat(&s, "open_connections"));
    CHECK(WAIT_UNTIL(fqt_server_stat(&s, "in_flight") == 0, 10000));
    CHECK_EQ_INT(fq_cancel(e, id), FQ_OK); /* cancelled already: harmless */
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&n.r.calls), 1);
    CHECK_EQ_INT(fqt_stat(e, "cancelled", -1), 1);
    netrec_clear(&n);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

TEST(http_time_limits) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    char url_buf_[256];
    netrec n;

    /* option timeout_ms on a request that never gets an answer */
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    long long t0 = fqt_now_ms();
    fetch(e, q, NULL, URL(&s, "/stall"), "{\"timeout_ms\": 300}", &n);
    long long dt = fqt_now_ms() - t0;
    expect(&n, FQ_FAILED, FQ_ERR_TIMEOUT, "timeout_ms 300 on /stall");
    CHECK_EQ_INT(n.http_status, 0);
    CHECK(n.r.has_error);
    if (dt < 250 || dt > 10000) FAILF("timeout_ms 300 ended after %lld ms", dt);
    netrec_clear(&n);
    fqt_engine_free(e);

    /* the engine's timeout_ms */
    e = fqt_engine("{\"timeout_ms\": 300}");
    q = fqt_queue(e, "q", 2);
    t0 = fqt_now_ms();
    fetch(e, q, NULL, URL(&s, "/stall"), NULL, &n);
    dt = fqt_now_ms() - t0;
    expect(&n, FQ_FAILED, FQ_ERR_TIMEOUT, "config timeout_ms 300 on /stall");
    if (dt < 250 || dt > 10000) FAILF("config timeout_ms 300 ended after %lld ms", dt);
    netrec_clear(&n);

    /* slow headers within the limit are fine */
    fetch(e, q, NULL, URL(&s, "/delay?ms=50"), NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "/delay 50 under timeout 300");
    check_json_eq(n.r.value, "{\"delayed\": 50}", "/delay value");
    netrec_clear(&n);

    /* connection refused */
    char refused[128];
    snprintf(refused, sizeof refused, "http://127.0.0.1:%d/json", fqt_closed_port());
    fetch(e, q, NULL, refused, NULL, &n);
    expect(&n, FQ_FAILED, FQ_ERR_NETWORK, refused);
    CHECK_EQ_INT(n.http_status, 0);
    CHECK(n.r.has_error);
    netrec_clear(&n);
    fqt_engine_free(e);

    /* max_wait_ms on a suspended queue: fails while still suspended, and the
     * server never sees the request */
    fqt_server_reset(&s);
    e = fqt_engine(NULL);
    q = fqt_queue(e, "q", 2);
    CHECK_OK(fq_queue_set_suspended(q, true));
    memset(&n, 0, sizeof n);
    t0 = fqt_now_ms();
    REQUIRE(submit_url(q, NULL, URL(&s, "/json"), "{\"max_wait_ms\": 200}", &n) > 0);
    CHECK(WAIT_UNTIL(atomic_load(&n.r.calls) == 1, FQT_LONG_MS));
    dt = fqt_now_ms() - t0;
    expect(&n, FQ_FAILED, FQ_ERR_QUEUE_TIMEOUT, "max_wait_ms 200 while suspended");
    if (dt < 150 || dt > 10000) FAILF("max_wait_ms 200 ended after %lld ms", dt);
    CHECK_EQ_INT(n.http_status, 0);
    netrec_clear(&n);
    fqt_engine_free(e);

    e = fqt_engine("{\"max_wait_ms\": 200}");
    q = fqt_queue(e, "q", 2);
    CHECK_OK(fq_queue_set_suspended(q, true));
    memset(&n, 0, sizeof n);
    REQUIRE(submit_url(q, NULL, URL(&s, "/json"), NULL, &n) > 0);
    CHECK(WAIT_UNTIL(atomic_load(&n.r.calls) == 1, FQT_LONG_MS));
    expect(&n, FQ_FAILED, FQ_ERR_QUEUE_TIMEOUT, "config max_wait_ms 200 while suspended");
    netrec_clear(&n);
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), 0);
    fqt_engine_free(e);

    /* the stalled connections were closed by the client */
    CHECK(WAIT_UNTIL(fqt_server_stat(&s, "open_connections") == 0, 10000));
    fqt_server_stop(&s);
}

TEST(http_redirects) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    char url_buf_[256];
    netrec n;

    fetch(e, q, NULL, URL(&s, "/redirect?n=3"), NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "/redirect?n=3");
    CHECK_EQ_INT(n.http_status, 200);
    CHECK_EQ_INT(fqt_int(n.metrics, "redirects", -1), 3);
    CHECK(json_is_array(json_object_get(n.r.value, "items")));
    netrec_clear(&n);

    fetch(e, q, NULL, URL(&s, "/redirect?n=3"), "{\"max_redirects\": 3}", &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "/redirect?n=3 with max_redirects 3");
    CHECK_EQ_INT(fqt_int(n.metrics, "redirects", -1), 3);
    netrec_clear(&n);

    fetch(e, q, NULL, URL(&s, "/redirect-loop"), NULL, &n);
    expect(&n, FQ_FAILED, FQ_ERR_REDIRECT, "/redirect-loop");
    CHECK(n.r.has_error);
    netrec_clear(&n);

    fetch(e, q, NULL, URL(&s, "/redirect?n=3"), "{\"max_redirects\": 2}", &n);
    expect(&n, FQ_FAILED, FQ_ERR_REDIRECT, "/redirect?n=3 with max_redirects 2");
    netrec_clear(&n);
    fqt_engine_free(e);

    /* the engine's max_redirects */
    e = fqt_engine("{\"max_redirects\": 2}");
    q = fqt_queue(e, "q", 2);
    fetch(e, q, NULL, URL(&s, "/redirect?n=3"), NULL, &n);
    expect(&n, FQ_FAILED, FQ_ERR_REDIRECT, "config max_redirects 2, n=3");
    netrec_clear(&n);
    fetch(e, q, NULL, URL(&s, "/redirect?n=2"), NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "config max_redirects 2, n=2");
    CHECK_EQ_INT(fqt_int(n.metrics, "redirects", -1), 2);
    netrec_clear(&n);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

TEST(http_max_response_bytes) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    char url_buf_[256];
    netrec n;
    const char *cap = "{\"max_response_bytes\": 1000}";

    static const char *const ok_paths[] = {"/bytes?n=1000", "/bytes?n=1000&chunked=1"};
    static const char *const big_paths[] = {"/bytes?n=1001", "/bytes?n=1001&chunked=1",
                                            "/bytes?n=5000000"};
    for (size_t i = 0; i < 2; i++) {
        fetch(e, q, NULL, URL(&s, ok_paths[i]), cap, &n);
        expect(&n, FQ_SUCCEEDED, FQ_OK, ok_paths[i]);
        CHECK_EQ_INT(n.body_len, 1000);
        bool same = n.body != NULL;
        for (size_t k = 0; same && k < n.body_len; k++)
            if (n.body[k] != (unsigned char)(k % 251)) same = false;
        CHECK(same);
        CHECK_EQ_INT(fqt_int(n.metrics, "bytes", -1), 1000);
        netrec_clear(&n);
    }
    for (size_t i = 0; i < 3; i++) {
        fetch(e, q, NULL, URL(&s, big_paths[i]), cap, &n);
        expect(&n, FQ_FAILED, FQ_ERR_TOO_LARGE, big_paths[i]);
        CHECK(n.r.has_error);
        netrec_clear(&n);
    }
    fqt_engine_free(e);

    /* the engine's max_response_bytes */
    e = fqt_engine(cap);
    q = fqt_queue(e, "q", 2);
    fetch(e, q, NULL, URL(&s, "/bytes?n=1000"), NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "config cap, n=1000");
    CHECK_EQ_INT(n.body_len, 1000);
    netrec_clear(&n);
    fetch(e, q, NULL, URL(&s, "/bytes?n=1001"), NULL, &n);
    expect(&n, FQ_FAILED, FQ_ERR_TOO_LARGE, "config cap, n=1001");
    netrec_clear(&n);
    /* an option overrides the engine's cap */
    fetch(e, q, NULL, URL(&s, "/bytes?n=1001"), "{\"max_response_bytes\": 1001}", &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "option cap 1001, n=1001");
    CHECK_EQ_INT(n.body_len, 1001);
    netrec_clear(&n);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

TEST(http_rejected_at_submit_never_called_back) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    char echo[128];
    snprintf(echo, sizeof echo, "%s/echo", s.base);

    /* requests built with json_pack so that control characters are exact */
    json_t *bad[32];
    const char *why[32];
    int nb = 0;
#define BAD(j, w)                                                                          \
    do {                                                                                   \
        bad[nb] = (j);                                                                     \
        why[nb] = (w);                                                                     \
        if (!bad[nb]) FAILF("json_pack for %s failed", why[nb]);                           \
        REQUIRE(bad[nb] != NULL);                                                          \
        nb++;                                                                              \
    } while (0)
    BAD(json_pack("{s:s}", "url", "ftp://127.0.0.1/x"), "ftp URL");
    BAD(json_pack("{s:s}", "url", "file:///etc/passwd"), "file URL");
    BAD(json_pack("{s:s}", "url", "gopher://127.0.0.1/"), "gopher URL");
    BAD(json_pack("{s:s}", "url", "not a url"), "no scheme");
    BAD(json_pack("{s:i}", "url", 5), "url not a string");
    BAD(json_pack("{s:s, s:{s:s}}", "url", echo, "headers", "X-A", "a\r\nX-Evil: 1"),
        "CRLF in a header value");
    BAD(json_pack("{s:s, s:{s:s}}", "url", echo, "headers", "X-A", "a\nb"),
        "LF in a header value");
    BAD(json_pack("{s:s, s:{s:s}}", "url", echo, "headers", "X-A", "a\rb"),
        "CR in a header value");
    BAD(json_pack("{s:s, s:{s:s#}}", "url", echo, "headers", "X-A", "a\0b", (size_t)3),
        "NUL in a header value");
    BAD(json_pack("{s:s, s:{s:s}}", "url", echo, "headers", "Bad Name", "v"),
        "space in a header name");
    BAD(json_pack("{s:s, s:{s:s}}", "url", echo, "headers", "X:Y", "v"),
        "colon in a header name");
    BAD(json_pack("{s:s, s:{s:s}}", "url", echo, "headers", "", "v"), "empty header name");
    BAD(json_pack("{s:s, s:{s:s}}", "url", echo, "headers", "X\r\nY", "v"),
        "CRLF in a header name");
    BAD(json_pack("{s:s, s:{s:i}}", "url", echo, "headers", "X-A", 1),
        "header value not a string");
    BAD(json_pack("{s:s, s:s}", "url", echo, "method", "GE T"), "space in the method");
    BAD(json_pack("{s:s, s:s}", "url", echo, "method", "GET\r\n"), "CRLF in the method");
    BAD(json_pack("{s:s, s:s}", "url", echo, "method", ""), "empty method");
    BAD(json_pack("{s:s, s:s}", "url", echo, "method", "G(E)T"), "separators in the method");
    BAD(json_pack("{s:s, s:i}", "url", echo, "method", 1), "method not a string");
    BAD(json_pack("{s:s, s:i}", "url", echo, "bogus_key", 1), "unknown request key");
    BAD(json_pack("{s:s, s:{s:{}}}", "url", echo, "query", "a"), "object in the query");
    BAD(json_pack("{s:s, s:{s:[]}}", "url", echo, "query", "a"), "array in the query");
    BAD(json_pack("{s:s, s:s}", "url", echo, "query", "a=1"), "query not an object");
    BAD(json_pack("{s:s, s:s}", "url", echo, "headers", "X-A: 1"), "headers not an object");
#undef BAD
    netrec n;
    memset(&n, 0, sizeof n);
    for (int i = 0; i < nb; i++) {
        fq_op_id id = fq_submit_request(q, bad[i], NULL, net_done, &n);
        if (id != FQ_ERR_INVALID)
            FAILF("%s: fq_submit_request returned %lld, expected FQ_ERR_INVALID", why[i],
                  (long long)id);
        else if (fq_last_error()[0] == '\0')
            FAILF("%s: no fq_last_error message", why[i]);
        json_decref(bad[i]);
    }

    /* bad options on a good request */
    static const struct {
        const char *options, *why, *names;
    } opts[] = {
        {"{\"bogus_option\": 1}", "unknown option key", "bogus_option"},
        {"{\"timeout_ms\": \"100\"}", "timeout_ms a string", "timeout_ms"},
        {"{\"max_redirects\": true}", "max_redirects a boolean", "max_redirects"},
        {"{\"parse\": 1}", "parse a number", "parse"},
        {"{\"parse\": \"yaml\"}", "unknown parse mode", "parse"},
        {"{\"lazy_parse\": 1}", "lazy_parse a number", "lazy_parse"},
        {"{\"marshal\": \"yes\"}", "marshal a string", "marshal"},
        {"{\"accept_status\": 404}", "accept_status not an array", "accept_status"},
        {"{\"accept_status\": [\"4xy\"]}", "bad status class", "accept_status"},
        {"{\"verify_tls\": \"no\"}", "verify_tls a string", "verify_tls"},
        {"{\"progress\": 1}", "progress a number", "progress"},
        {"{\"user_agent\": 5}", "user_agent a number", "user_agent"},
        {"{\"priority\": \"urgent\"}", "unknown priority", "priority"},
    };
    json_t *good = json_pack("{s:s}", "url", echo);
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        json_t *o = fqt_json(opts[i].options);
        fq_op_id id = fq_submit_request(q, good, o, net_done, &n);
        if (id != FQ_ERR_INVALID)
            FAILF("%s (%s): fq_submit_request returned %lld, expected FQ_ERR_INVALID",
                  opts[i].why, opts[i].options, (long long)id);
        else if (!strstr(fq_last_error(), opts[i].names))
            FAILF("%s: fq_last_error \"%s\" does not name %s", opts[i].why, fq_last_error(),
                  opts[i].names);
        json_decref(o);
    }
    json_decref(good);

    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&n.r.calls), 0);
    CHECK_EQ_INT(fqt_stat(e, "submitted", -1), 0);
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), 0);

    /* the same queue still works */
    char url_buf_[256];
    fetch(e, q, NULL, URL(&s, "/echo"), NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "a good request after the rejected ones");
    netrec_clear(&n);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* ------------------------------------------------------------------ */
/* Progress events                                                      */

#define MAX_EVENTS 4096

typedef struct {
    int type;
    fq_op_id id;
    uint64_t received, expected;
    long seq;
    int rc;
    bool child_null;
} ev_rec;

typedef struct {
    pthread_mutex_t mu;
    int n;
    int overflow;
    ev_rec ev[MAX_EVENTS];
} ev_log;

static void on_event(const fq_event *ev, void *userdata) {
    ev_log *log = userdata;
    ev_rec r = {0};
    r.type = (int)fq_event_get_type(ev);
    r.id = fq_event_op_id(ev);
    r.rc = fq_event_progress(ev, &r.received, &r.expected);
    r.child_null = fq_event_result(ev) == NULL;
    r.seq = fqt_seq();
    pthread_mutex_lock(&log->mu);
    if (log->n < MAX_EVENTS) log->ev[log->n++] = r;
    else log->overflow++;
    pthread_mutex_unlock(&log->mu);
}

TEST(http_progress_events) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    ev_log *log = calloc(1, sizeof *log);
    REQUIRE(log != NULL);
    pthread_mutex_init(&log->mu, NULL);
    CHECK_OK(fq_engine_set_event_fn(e, on_event, log));
    char url_buf_[256];
    netrec n, quiet;
    memset(&n, 0, sizeof n);
    memset(&quiet, 0, sizeof quiet);
    fq_op_id id = submit_url(q, NULL, URL(&s, "/drip?bytes=1000&chunk=100&interval_ms=30"),
                             "{\"progress_interval_ms\": 0}", &n);
    /* a request that did not ask for progress gets no events */
    fq_op_id quiet_id = submit_url(q, NULL, URL(&s, "/drip?bytes=500&chunk=100&interval_ms=20"),
                                   NULL, &quiet);
    REQUIRE(id > 0 && quiet_id > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&n.r.calls), 1);
    CHECK_EQ_INT(atomic_load(&quiet.r.calls), 1);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "/drip with progress");
    expect(&quiet, FQ_SUCCEEDED, FQ_OK, "/drip without progress");
    CHECK_EQ_INT(n.body_len, 1000);

    pthread_mutex_lock(&log->mu);
    int count = log->n;
    CHECK_EQ_INT(log->overflow, 0);
    int mine = 0;
    uint64_t last = 0;
    ev_rec *lastev = NULL;
    for (int i = 0; i < count; i++) {
        ev_rec *r = &log->ev[i];
        if (r->id == quiet_id) {
            FAILF("event %d for the request that did not ask for progress", i);
            continue;
        }
        if (r->id != id) {
            FAILF("event %d for unknown op %lld", i, (long long)r->id);
            continue;
        }
        CHECK_EQ_INT(r->type, FQ_EVENT_PROGRESS);
        CHECK_OK(r->rc);
        CHECK(r->child_null);
        if (mine > 0 && r->received <= last)
            FAILF("event %d: received %llu after %llu (not increasing)", i,
                  (unsigned long long)r->received, (unsigned long long)last);
        if (r->received > 0 && r->expected != 1000)
            FAILF("event %d: expected %llu, want 1000", i, (unsigned long long)r->expected);
        if (r->received > 1000) FAILF("event %d: received %llu > 1000", i,
                                      (unsigned long long)r->received);
        if (r->seq >= n.r.done_seq) FAILF("event %d came after the completion callback", i);
        last = r->received;
        lastev = r;
        mine++;
    }
    /* 10 chunks 30 ms apart: several events, the last one complete */
    if (mine < 3) FAILF("only %d progress events for a 10-chunk drip", mine);
    REQUIRE(lastev != NULL);
    CHECK_EQ_INT(lastev->received, 1000);
    CHECK_EQ_INT(lastev->expected, 1000);
    pthread_mutex_unlock(&log->mu);

    netrec_clear(&n);
    netrec_clear(&quiet);
    CHECK_OK(fq_engine_set_event_fn(e, NULL, NULL));
    fqt_engine_free(e);
    pthread_mutex_destroy(&log->mu);
    free(log);
    fqt_server_stop(&s);
}

/* ------------------------------------------------------------------ */
/* JSONTestSuite over HTTP                                              */

typedef struct {
    char name[256];
    fq_op_id id;
    netrec n;
} suite_file;

static int cmp_names(const void *a, const void *b) {
    return strcmp(((const suite_file *)a)->name, ((const suite_file *)b)->name);
}

/* Every JSONTestSuite file served over HTTP with "parse": "json", eagerly or
 * with "lazy_parse" (then the value is built by the fq_result_value() call in
 * rec_done, after fq_result_has_value() was recorded): the same outcomes. */
static void check_suite_over_http(bool lazy) {
    const char *dir = fqt_jsontestsuite_dir();
    REQUIRE(dir != NULL);
    DIR *d = opendir(dir);
    REQUIRE(d != NULL);
    int cap = 1024, nf = 0;
    suite_file *files = calloc((size_t)cap, sizeof *files);
    REQUIRE(files != NULL);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *nm = de->d_name;
        size_t l = strlen(nm);
        if (nm[0] == '.' || l < 6 || strcmp(nm + l - 5, ".json") != 0) continue;
        if (nf == cap) {
            FAILF("more than %d files in %s", cap, dir);
            break;
        }
        snprintf(files[nf++].name, sizeof files[0].name, "%s", nm);
    }
    closedir(d);
    qsort(files, (size_t)nf, sizeof *files, cmp_names);
    REQUIRE(nf > 0);
    h_note("%d files from %s", nf, dir);

    fqt_server s;
    fqt_server_start(&s, dir);
    fq_engine *e = fqt_engine("{\"max_per_host\": 8}");
    fq_queue *q = fqt_queue(e, "q", 8);
    const char *opts = lazy ? "{\"parse\": \"json\", \"max_json_depth\": 2048, \"lazy_parse\": true}"
                            : "{\"parse\": \"json\", \"max_json_depth\": 2048}";
    for (int i = 0; i < nf; i++) {
        char enc[800], url[1024];
        snprintf(url, sizeof url, "%s/file/%s", s.base, fqt_pct(files[i].name, enc, sizeof enc));
        files[i].id = submit_url(q, NULL, url, opts, &files[i].n);
        if (files[i].id <= 0) FAILF("%s: not submitted", files[i].name);
    }
    int rc = fq_engine_wait_idle(e, h_scaled_ms(120000));
    CHECK_OK(rc);

    int total = 0, y = 0, nn = 0, ii = 0;
    for (int i = 0; i < nf; i++) {
        const char *nm = files[i].name;
        netrec *r = &files[i].n;
        int calls = atomic_load(&r->r.calls);
        total += calls;
        if (calls != 1) {
            FAILF("%s: %d callbacks", nm, calls);
            continue;
        }
        if (r->r.id != files[i].id)
            FAILF("%s: callback for op %lld, submitted as %lld", nm, (long long)r->r.id,
                  (long long)files[i].id);
        if (r->r.outcome != FQ_CANCELLED && r->http_status != 200)
            FAILF("%s: http status %ld", nm, r->http_status);
        if (strcmp(nm, "y_object_escaped_null_in_key.json") == 0) {
            /* jansson cannot hold a NUL in an object key */
            if (r->r.outcome != FQ_FAILED || r->r.status != FQ_ERR_PARSE)
                FAILF("%s: outcome %d status %d, expected FAILED/FQ_ERR_PARSE (%s)", nm,
                      r->r.outcome, r->r.status, r->r.error);
            y++;
        } else if (nm[0] == 'y') {
            if (r->r.outcome != FQ_SUCCEEDED)
                FAILF("%s: outcome %d status %d, expected SUCCEEDED (%s)", nm, r->r.outcome,
                      r->r.status, r->r.error);
            else {
                /* the value is what jansson makes of the same bytes */
                json_t *want = json_loadb((const char *)r->body, r->body_len,
                                          JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
                if (want && !json_equal(want, r->r.value))
                    FAILF("%s: the value differs from jansson's parse of the body", nm);
                if (!r->has_value) FAILF("%s: fq_result_has_value() is false", nm);
                json_decref(want);
            }
            y++;
        } else if (nm[0] == 'n') {
            if (r->r.outcome != FQ_FAILED || r->r.status != FQ_ERR_PARSE)
                FAILF("%s: outcome %d status %d, expected FAILED/FQ_ERR_PARSE (%s)", nm,
                      r->r.outcome, r->r.status, r->r.error);
            nn++;
        } else {
            if (r->r.outcome == FQ_CANCELLED)
                FAILF("%s: cancelled (%s)", nm, r->r.error);
            else if (r->r.outcome == FQ_FAILED && r->r.status != FQ_ERR_PARSE)
                FAILF("%s: failed with %d, expected success or FQ_ERR_PARSE (%s)", nm,
                      r->r.status, r->r.error);
            ii++;
        }
    }
    CHECK_EQ_INT(total, nf);
    CHECK_EQ_INT(y + nn + ii, nf);
    CHECK_EQ_INT(fqt_stat(e, "submitted", -1), nf);
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), nf);
    h_note("%d y_, %d n_, %d i_", y, nn, ii);
    for (int i = 0; i < nf; i++) {
        if (files[i].n.r.outcome == FQ_FAILED && files[i].n.has_value)
            FAILF("%s: failed, yet fq_result_has_value() is true", files[i].name);
        netrec_clear(&files[i].n);
    }
    free(files);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

TEST_T(http_jsontestsuite_files, 180) { check_suite_over_http(false); }

TEST_T(http_jsontestsuite_files_lazy_parse, 180) { check_suite_over_http(true); }

/* Records what a completion sees of a "lazy_parse" result without reading
 * its value (so that a dependent is the first to read it). */
typedef struct lazyrec {
    rec r;
    bool has_value;
    char error[256];
} lazyrec;

static void lazy_done(const fq_result *res, void *userdata) {
    lazyrec *l = userdata;
    l->has_value = fq_result_has_value(res);
    l->r.id = fq_result_op_id(res);
    l->r.outcome = (int)fq_result_outcome(res);
    l->r.status = fq_result_status(res);
    const char *err = fq_result_error(res);
    snprintf(l->error, sizeof l->error, "%s", err ? err : "");
    atomic_fetch_add(&l->r.calls, 1);
}

/* A dependent reads a "lazy_parse" dependency: the value is built there. */
static json_t *body_read_lazy_dependency(fq_op *op, void *userdata) {
    rec *r = userdata;
    const fq_result *dep = fq_op_dependency(op, r->dep);
    if (!dep) return json_string("no dependency result");
    if (!fq_result_has_value(dep)) return json_string("no value said");
    json_t *first = fq_result_value(dep);
    if (!first) return json_string("no value built");
    if (fq_result_value(dep) != first) return json_string("a second read built another value");
    if (fq_op_dependency_result(op, r->dep) != first) return json_string("fq_op_dependency_result differs");
    size_t len = 0;
    const unsigned char *body = fq_result_body(dep, &len);
    json_t *want = body ? json_loadb((const char *)body, len, 0, NULL) : NULL;
    bool same = want && json_equal(want, first);
    json_decref(want);
    r->user = (void *)fq_result_retain(dep); /* read again after the body returned */
    return same ? json_incref(first) : json_string("the value is not the body's parse");
}

static void retain_done(const fq_result *res, void *userdata) {
    const fq_result **kept = userdata;
    *kept = fq_result_retain(fq_result_retain(res)); /* two retains: two releases below */
}

/* A retained result stays readable after its callback, after the engine
 * forgot it and after the engine is freed; its headers, metrics and lazy
 * value are built only then. */
TEST(http_retained_result_outlives_its_callback) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine("{\"history\": 1, \"history_values\": 1}");
    fq_queue *q = fqt_queue(e, "q", 1);
    char url_buf_[256];
    const fq_result *kept = NULL;
    json_t *req = json_pack("{s:s}", "url", URL(&s, "/json?size=500"));
    json_t *opt = fqt_json("{\"lazy_parse\": true}");
    fq_op_id id = fq_submit_request(q, req, opt, retain_done, &kept);
    REQUIRE(id > 0);
    json_decref(req);
    json_decref(opt);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    REQUIRE(kept != NULL);
    for (int i = 0; i < 3; i++) { /* push it out of the engine's history */
        rec r;
        memset(&r, 0, sizeof r);
        REQUIRE(fqt_block(q, body_noop, NULL, rec_done, &r) > 0);
        CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
        rec_clear(&r);
    }
    fqt_engine_free(e);
    fqt_server_stop(&s);

    CHECK_EQ_INT(fq_result_op_id(kept), id);
    CHECK_EQ_INT(fq_result_outcome(kept), FQ_SUCCEEDED);
    CHECK_EQ_INT(fq_result_http_status(kept), 200);
    CHECK(fq_result_error(kept) == NULL);
    CHECK(fq_result_has_value(kept));
    size_t len = 0;
    const unsigned char *body = fq_result_body(kept, &len);
    REQUIRE(body != NULL && len >= 500);
    json_t *headers = fq_result_headers(kept);
    CHECK_JSTR(headers, "content-type", "application/json");
    json_t *metrics = fq_result_metrics(kept);
    CHECK_EQ_INT(json_integer_value(json_object_get(metrics, "bytes")), (long long)len);
    json_t *want = json_loadb((const char *)body, len, 0, NULL);
    json_t *value = fq_result_value(kept);
    CHECK(value != NULL && json_equal(want, value));
    CHECK(fq_result_value(kept) == value && fq_result_headers(kept) == headers);
    json_decref(want);
    fq_result_release(kept);
    CHECK(fq_result_value(kept) == value); /* one retain left */
    fq_result_release(kept);
    fq_result_release(NULL);
    CHECK(fq_result_retain(NULL) == NULL);
}

/* Writes `text` to dir/name. */
static void write_file(const char *dir, const char *name, const char *text, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    REQUIRE(f != NULL);
    REQUIRE(fwrite(text, 1, len, f) == len);
    REQUIRE(fclose(f) == 0);
}

/* Option "marshal": the value in CPython's marshal format, byte for byte as
 * fetchq.h describes it (these bytes were checked with Python's
 * marshal.loads against json.loads of the same text; the Python binding's
 * tests check every JSONTestSuite file and generated documents that way). */
TEST(http_marshal_writes_the_value_in_marshal_format) {
    char dir[] = "/tmp/fqt-marshal-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    static const char doc[] =
        "{\"k\":[2147483648,-2147483649,-9223372036854775808,1.5,-0.0,\"\\u00e9\",true,false,null,7],"
        "\"o\":{\"k\":\"x\",\"k\":\"y\"}}";
    /* '{', key "k" flagged as reference 0 ('z' | 0x80), the list of 10: 2^31,
     * -(2^31 + 1) and -2^63 in 15-bit digits ('l'), 1.5 and -0.0 ('g'), "é"
     * ('u', UTF-8), 'T', 'F', 'N', 7 ('i'); key "o" (reference 1), a dict
     * whose repeated key "k" refers to reference 0 ('r') twice, then the
     * two dicts' ends ('0'). */
    static const unsigned char want[] =
        "\x7b\xfa\x01\x6b\x5b\x0a\x00\x00\x00\x6c\x03\x00\x00\x00\x00\x00\x00\x00\x02\x00\x6c\xfd\xff\xff\xff"
        "\x01\x00\x00\x00\x02\x00\x6c\xfb\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x08\x00\x67\x00\x00\x00"
        "\x00\x00\x00\xf8\x3f\x67\x00\x00\x00\x00\x00\x00\x00\x80\x75\x02\x00\x00\x00\xc3\xa9\x54\x46\x4e\x69"
        "\x07\x00\x00\x00\xfa\x01\x6f\x7b\x72\x00\x00\x00\x00\x7a\x01\x78\x72\x00\x00\x00\x00\x7a\x01\x79\x30"
        "\x30";
    write_file(dir, "doc.json", doc, sizeof doc - 1);
    /* 300 ASCII bytes: 'a' with a 4-byte length (up to 255: 'z') */
    char long_doc[310];
    memset(long_doc, 'x', sizeof long_doc);
    long_doc[0] = '[';
    long_doc[1] = '"';
    long_doc[302] = '"';
    long_doc[303] = ']';
    write_file(dir, "long.json", long_doc, 304);
    /* raw UTF-8 (no escape): 'u', never 'z' */
    write_file(dir, "utf8.json", "[\"\xc3\xbc\"]", 6);
    /* 501 nested arrays: valid JSON, too deep for the marshal form */
    char deep[1002];
    memset(deep, '[', 501);
    memset(deep + 501, ']', 501);
    write_file(dir, "deep.json", deep, sizeof deep);
    write_file(dir, "bad.json", "[1,]", 4);

    fqt_server s;
    fqt_server_start(&s, dir);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    char url_buf_[256];
    const char *with[] = {"{\"marshal\": true}", "{\"marshal\": true, \"lazy_parse\": true}"};
    for (int i = 0; i < 2; i++) {
        netrec n;
        fetch(e, q, NULL, URL(&s, "/file/doc.json"), with[i], &n);
        expect(&n, FQ_SUCCEEDED, FQ_OK, with[i]);
        CHECK(n.has_value);
        CHECK_EQ_INT((long long)n.marshal_len, (long long)(sizeof want - 1));
        if (n.marshal && n.marshal_len == sizeof want - 1 && memcmp(n.marshal, want, sizeof want - 1) != 0)
            FAILF("%s: the marshal bytes differ", with[i]);
        if (!n.marshal) FAILF("%s: no marshal bytes", with[i]);
        netrec_clear(&n);

        fetch(e, q, NULL, URL(&s, "/file/long.json"), with[i], &n);
        expect(&n, FQ_SUCCEEDED, FQ_OK, with[i]);
        REQUIRE(n.marshal != NULL);
        CHECK_EQ_INT((long long)n.marshal_len, 5 + 5 + 300);
        CHECK(memcmp(n.marshal, "[\x01\x00\x00\x00" "a\x2c\x01\x00\x00", 10) == 0);
        CHECK(n.marshal_len == 310 && n.marshal[10] == 'x' && n.marshal[309] == 'x');
        netrec_clear(&n);

        fetch(e, q, NULL, URL(&s, "/file/utf8.json"), with[i], &n);
        expect(&n, FQ_SUCCEEDED, FQ_OK, with[i]);
        CHECK(n.marshal_len == 12 && n.marshal &&
              memcmp(n.marshal, "[\x01\x00\x00\x00" "u\x02\x00\x00\x00\xc3\xbc", 12) == 0);
        netrec_clear(&n);

        /* too deep for it: the value is still there, the marshal form not */
        fetch(e, q, NULL, URL(&s, "/file/deep.json"), with[i], &n);
        expect(&n, FQ_SUCCEEDED, FQ_OK, with[i]);
        CHECK(n.has_value);
        CHECK(n.marshal == NULL && n.marshal_len == 0);
        netrec_clear(&n);

        /* not JSON: the same failure as without the option, and none */
        fetch(e, q, NULL, URL(&s, "/file/bad.json"), with[i], &n);
        expect(&n, FQ_FAILED, FQ_ERR_PARSE, with[i]);
        CHECK(n.marshal == NULL && n.marshal_len == 0);
        netrec_clear(&n);
    }
    /* without the option, or without a parse: none */
    const char *without[] = {NULL, "{\"lazy_parse\": true}", "{\"marshal\": false}",
                             "{\"marshal\": true, \"parse\": \"none\"}"};
    for (int i = 0; i < 4; i++) {
        netrec n;
        fetch(e, q, NULL, URL(&s, "/file/doc.json"), without[i], &n);
        expect(&n, FQ_SUCCEEDED, FQ_OK, without[i] ? without[i] : "no options");
        CHECK(n.marshal == NULL && n.marshal_len == 0);
        CHECK(n.body_len == sizeof doc - 1);
        netrec_clear(&n);
    }
    CHECK(fq_result_marshal(NULL, NULL) == NULL);
    fqt_engine_free(e);
    fqt_server_stop(&s);
    const char *names[] = {"doc.json", "long.json", "utf8.json", "deep.json", "bad.json"};
    for (int i = 0; i < 5; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

TEST(http_lazy_parse_builds_the_value_on_first_read) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    char url_buf_[256];

    /* a JSON response: checked at the end, built by the dependent's read */
    lazyrec l;
    memset(&l, 0, sizeof l);
    json_t *req = json_pack("{s:s}", "url", URL(&s, "/json?size=300"));
    json_t *opt = fqt_json("{\"lazy_parse\": true}");
    fq_op_id id = fq_submit_request(q, req, opt, lazy_done, &l);
    REQUIRE(id > 0);
    json_decref(opt);
    rec dep;
    memset(&dep, 0, sizeof dep);
    dep.dep = id;
    char deps[64];
    snprintf(deps, sizeof deps, "{\"depends_on\": [%lld]}", (long long)id);
    REQUIRE(fqt_block(q, body_read_lazy_dependency, deps, rec_done, &dep) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&l.r.calls), 1);
    CHECK_EQ_INT(l.r.outcome, FQ_SUCCEEDED);
    CHECK(l.has_value);
    CHECK_EQ_INT(atomic_load(&dep.calls), 1);
    CHECK_EQ_INT(dep.outcome, FQ_SUCCEEDED);
    if (!json_is_object(dep.value)) {
        FAILF("the dependent saw: %s", json_is_string(dep.value) ? json_string_value(dep.value) : "no value");
    } else {
        CHECK(json_is_array(json_object_get(dep.value, "items")));
    }
    /* a dependency's result retained in the body: still the same value */
    const fq_result *kept = dep.user;
    REQUIRE(kept != NULL);
    CHECK_EQ_INT(fq_result_op_id(kept), id);
    CHECK(fq_result_value(kept) != NULL && json_equal(fq_result_value(kept), dep.value));
    fq_result_release(kept);
    rec_clear(&dep);

    /* invalid JSON: the same failure, and the same message, as without it */
    const char *modes[] = {"{\"parse\": \"json\", \"lazy_parse\": true}", "{\"parse\": \"json\"}"};
    lazyrec bad[2];
    memset(bad, 0, sizeof bad);
    json_decref(req);
    req = json_pack("{s:s}", "url", URL(&s, "/bytes?n=300"));
    for (int i = 0; i < 2; i++) {
        opt = fqt_json(modes[i]);
        REQUIRE(fq_submit_request(q, req, opt, lazy_done, &bad[i]) > 0);
        json_decref(opt);
    }
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(atomic_load(&bad[i].r.calls), 1);
        CHECK_EQ_INT(bad[i].r.outcome, FQ_FAILED);
        CHECK_EQ_INT(bad[i].r.status, FQ_ERR_PARSE);
        CHECK(!bad[i].has_value);
    }
    CHECK(strstr(bad[0].error, "not valid JSON") != NULL);
    CHECK_STR(bad[0].error, bad[1].error);

    /* parse "none", or a response that is not JSON with "auto": no value */
    const char *none[][2] = {{"/json?size=50", "{\"parse\": \"none\", \"lazy_parse\": true}"},
                             {"/bytes?n=20", "{\"lazy_parse\": true}"}};
    for (int i = 0; i < 2; i++) {
        netrec n;
        fetch(e, q, NULL, URL(&s, none[i][0]), none[i][1], &n);
        expect(&n, FQ_SUCCEEDED, FQ_OK, none[i][1]);
        CHECK(!n.has_value);
        CHECK(n.r.value == NULL);
        CHECK(n.body != NULL);
        netrec_clear(&n);
    }
    json_decref(req);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* What a block saw of one dependency through fq_op_dependency(). */
typedef struct depview {
    rec r;               /* first: rec_done sees the userdata as a rec */
    fq_op_id dep;
    bool found;          /* fq_op_dependency() returned a result */
    int outcome, status;
    long http_status;
    bool has_body;
    json_t *value;       /* fq_op_dependency_result(), kept (incref) */
    bool same_value;     /* fq_result_value() of the result is that value */
    char error[256];     /* fq_result_error(), "" if NULL */
} depview;

static json_t *body_view_dependency(fq_op *op, void *userdata) {
    depview *v = userdata;
    const fq_result *r = fq_op_dependency(op, v->dep);
    v->found = r != NULL;
    if (r) {
        v->outcome = fq_result_outcome(r);
        v->status = fq_result_status(r);
        v->http_status = fq_result_http_status(r);
        size_t len = 0;
        v->has_body = fq_result_body(r, &len) != NULL;
        const char *err = fq_result_error(r);
        snprintf(v->error, sizeof v->error, "%s", err ? err : "");
        v->same_value = fq_result_value(r) == fq_op_dependency_result(op, v->dep);
    }
    v->value = json_incref(fq_op_dependency_result(op, v->dep));
    return NULL;
}

/* "history_values": only the newest N finished network operations keep their
 * result for a dependent submitted later; an older one still counts as
 * succeeded, and its dependent is told (not handed NULL silently). */
static void check_history_values(const fqt_server *sp, const char *request_options) {
    const fqt_server *s_ = sp;
    fq_engine *e = fqt_engine("{\"history_values\": 2}");
    fq_queue *q = fqt_queue(e, "q", 1);
    char url_buf_[256];
    enum { N = 4 };
    netrec n[N];
    fq_op_id ids[N];
    memset(n, 0, sizeof n);
    for (int i = 0; i < N; i++) {
        char path[32];
        snprintf(path, sizeof path, "/echo?i=%d", i);
        ids[i] = submit_url(q, NULL, URL(s_, path), request_options, &n[i]);
        REQUIRE(ids[i] > 0);
    }
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < N; i++) {
        REQUIRE(atomic_load(&n[i].r.calls) == 1);
        expect(&n[i], FQ_SUCCEEDED, FQ_OK, "/echo");
        REQUIRE(json_is_object(n[i].r.value));
    }

    /* All four finished; the queue ran them in order, so 2 and 3 are kept. */
    depview v[N];
    memset(v, 0, sizeof v);
    for (int i = 0; i < N; i++) {
        char opts[64];
        snprintf(opts, sizeof opts, "{\"depends_on\": [%lld]}", (long long)ids[i]);
        v[i].dep = ids[i];
        REQUIRE(fqt_block(q, body_view_dependency, opts, rec_done, &v[i]) > 0);
        CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
        CHECK_EQ_INT(v[i].r.outcome, FQ_SUCCEEDED);
    }
    for (int i = 0; i < N; i++) {
        CHECK(v[i].found);
        CHECK_EQ_INT(v[i].outcome, FQ_SUCCEEDED);
        CHECK_EQ_INT(v[i].status, FQ_OK);
        CHECK(v[i].same_value);
        if (i >= N - 2) { /* kept: the value, status and body the callback saw */
            CHECK(json_equal(v[i].value, n[i].r.value));
            CHECK_EQ_INT(v[i].http_status, 200);
            CHECK(v[i].has_body);
            CHECK_STR(v[i].error, "");
        } else { /* dropped: said so, with the id and the setting */
            CHECK(v[i].value == NULL);
            CHECK(!v[i].has_body);
            CHECK(strstr(v[i].error, "no longer kept") != NULL);
            CHECK(strstr(v[i].error, "history_values (2)") != NULL);
            CHECK(fqt_names_id(v[i].error, ids[i]));
        }
        json_decref(v[i].value);
        rec_clear(&v[i].r);
        netrec_clear(&n[i]);
    }
    fqt_engine_free(e);
}

TEST(http_history_values_keeps_the_newest_results) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    check_history_values(&s, NULL);                     /* a GET shares transfers (coalesce) */
    check_history_values(&s, "{\"coalesce\": false}"); /* its own transfer */
    fqt_server_stop(&s);
}

/* Where a network operation's callback ran, and what a wait from there said. */
typedef struct threadrec {
    netrec n;            /* first: net_done sees the userdata as a netrec */
    fq_engine *e;
    char thread[16];     /* the callback thread's name */
    int wait_status;     /* fq_engine_wait_idle(e, 0) from the callback */
} threadrec;

static void thread_done(const fq_result *res, void *userdata) {
    threadrec *t = userdata;
    pthread_getname_np(pthread_self(), t->thread, sizeof t->thread);
    t->wait_status = fq_engine_wait_idle(t->e, 0);
    net_done(res, userdata);
}

static void fetch_on(fq_engine *e, fq_queue *q, const char *url, threadrec *t) {
    memset(t, 0, sizeof *t);
    t->e = e;
    json_t *req = json_pack("{s:s}", "url", url);
    REQUIRE(fq_submit_request(q, req, NULL, thread_done, t) > 0);
    json_decref(req);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    REQUIRE(atomic_load(&t->n.r.calls) == 1);
    expect(&t->n, FQ_SUCCEEDED, FQ_OK, url);
    CHECK(json_is_object(t->n.r.value));
    CHECK_EQ_INT(t->wait_status, FQ_ERR_STATE); /* an engine thread cannot wait for itself */
}

/* A transfer thread ends the operations of the responses it received up to
 * 64 KiB: with inline delivery their callbacks run there; a larger body is
 * parsed, and its callback run, on a worker. With thread delivery every
 * callback runs on the delivery thread. One request at a time, so nothing
 * else is being delivered when each one ends. */
TEST(http_transfer_threads_end_small_responses) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    char url_buf_[256];
    threadrec t;
    for (int threads = 1; threads <= 2; threads++) {
        char config[96];
        snprintf(config, sizeof config, "{\"delivery\": \"inline\", \"transfer_threads\": %d}", threads);
        fq_engine *e = fqt_engine(config);
        fq_queue *q = fqt_queue(e, "q", 1);
        fetch_on(e, q, URL(&s, "/json?size=2000"), &t);
        CHECK_STR(t.thread, "fetchq-curl");
        netrec_clear(&t.n);
        fetch_on(e, q, URL(&s, "/json?size=200000"), &t);
        CHECK(t.n.body_len > 64 * 1024);
        CHECK(strncmp(t.thread, "fetchq-work-", 12) == 0);
        netrec_clear(&t.n);
        fqt_engine_free(e);
    }
    fq_engine *e = fqt_engine("{\"delivery\": \"thread\"}");
    fq_queue *q = fqt_queue(e, "q", 1);
    fetch_on(e, q, URL(&s, "/json?size=2000"), &t);
    CHECK_STR(t.thread, "fetchq-deliver");
    netrec_clear(&t.n);
    fetch_on(e, q, URL(&s, "/json?size=200000"), &t);
    CHECK_STR(t.thread, "fetchq-deliver");
    netrec_clear(&t.n);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* Identical GETs under churn. Each round submits 6 identical GETs of a 40 ms
 * /delay over 3 queues (the first one runs the shared transfer, the others
 * attach to it), then does one of: nothing; cancel the first at once; cancel
 * the first once the server has the request (it hands the running transfer
 * over); cancel three of the others; cancel all six; give the first a
 * dependency on a block operation of a suspended queue (it leaves the
 * transfer to the others and later runs its own). Every operation gets
 * exactly one callback; one whose fq_cancel returned FQ_OK ended CANCELLED;
 * every other one succeeded with the server's answer; and the server saw one
 * request per round (none or one when all six were cancelled, two when the
 * first got a dependency): a transfer is never sent again. */
enum { CHURN_ROUNDS = 36, CHURN_OPS = 6 };

/* A shared transfer's callers are counted once each in the stats, also when
 * the first caller leaves it before it started (a dependency, a cancel) and
 * an internal carrier takes it over; a caller sharing another's transfer
 * cannot be given a dependency and is told why. Nothing is sent: the queue
 * is suspended (port 9 is never reached). */
TEST(http_stats_count_a_shared_transfers_callers_once) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 4), *held = fqt_queue(e, "held", 1);
    CHECK_OK(fq_queue_set_suspended(q, true));
    CHECK_OK(fq_queue_set_suspended(held, true));
    rec r[6];
    memset(r, 0, sizeof r);
    json_t *req = json_pack("{s:s}", "url", "http://127.0.0.1:9/x");
    fq_op_id first = fq_submit_request(q, req, NULL, rec_done, &r[0]);
    fq_op_id second = fq_submit_request(q, req, NULL, rec_done, &r[1]);
    fq_op_id dep = fqt_block(held, body_noop, NULL, rec_done, &r[2]);
    REQUIRE(first > 0 && second > 0 && dep > 0);
    CHECK_EQ_INT(fqt_stat(e, "queued", -1), 3);
    CHECK_EQ_INT(fq_add_dependency(e, second, dep), FQ_ERR_STATE);
    CHECK_CONTAINS(fq_last_error(), "shares another operation's transfer");
    CHECK_OK(fq_add_dependency(e, first, dep));  /* leaves the transfer to `second` */
    CHECK_EQ_INT(fqt_stat(e, "submitted", -1), 3);
    CHECK_EQ_INT(fqt_stat(e, "queued", -1), 3);
    CHECK_EQ_INT(fqt_stat(e, "undelivered", -1), 0);
    CHECK_EQ_INT(fqt_qstat(e, "q", "queued", -1), 2);
    /* Three more sharing another URL; the first is cancelled while queued. */
    json_t *req2 = json_pack("{s:s}", "url", "http://127.0.0.1:9/y");
    fq_op_id more[3];
    for (int i = 0; i < 3; i++) more[i] = fq_submit_request(q, req2, NULL, rec_done, &r[3 + i]);
    REQUIRE(more[0] > 0 && more[1] > 0 && more[2] > 0);
    CHECK_OK(fq_cancel(e, more[0]));
    CHECK(WAIT_UNTIL(atomic_load(&r[3].calls) == 1, FQT_LONG_MS));
    CHECK_EQ_INT(r[3].outcome, FQ_CANCELLED);
    CHECK_EQ_INT(fqt_stat(e, "cancelled", -1), 1);
    CHECK_EQ_INT(fqt_stat(e, "queued", -1), 5);
    CHECK_EQ_INT(fqt_stat(e, "undelivered", -1), 0);
    CHECK_EQ_INT(fqt_qstat(e, "q", "queued", -1), 4);
    json_decref(req);
    json_decref(req2);
    fqt_engine_free(e);  /* ends the others, cancelled */
    for (int i = 0; i < 6; i++) CHECK_EQ_INT(atomic_load(&r[i].calls), 1);
    for (int i = 0; i < 6; i++) rec_clear(&r[i]);
}

static json_t *body_fails_at_once(fq_op *op, void *userdata) {
    (void)userdata;
    fq_op_set_error(op, "failed on purpose");
    return NULL;
}

/* The first caller of a shared GET given a dependency that had already
 * failed ends at once, FQ_ERR_DEPENDENCY; the callers sharing its transfer
 * have no such dependency: they are handed to a carrier and run (they ended
 * FQ_ERR_DEPENDENCY naming the first caller's dependency; the stress
 * program, seed 2, 30 % network). */
TEST(http_a_shared_gets_callers_do_not_end_with_the_first_callers_failed_dependency) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 4);
    rec failing = {0}, first = {0}, second = {0};
    fq_op_id dep = fqt_block(q, body_fails_at_once, NULL, rec_done, &failing);
    REQUIRE(dep > 0 && WAIT_UNTIL(atomic_load(&failing.calls) == 1, FQT_LONG_MS));
    CHECK_EQ_INT(failing.outcome, FQ_FAILED);
    CHECK_OK(fq_queue_set_suspended(q, true));
    char req[400];
    fqt_get_request(&s, "/json?size=3", req, sizeof req);
    fq_op_id a = fqt_request(q, req, NULL, rec_done, &first);
    fq_op_id b = fqt_request(q, req, NULL, rec_done, &second); /* shares a's transfer */
    REQUIRE(a > 0 && b > 0);
    CHECK_OK(fq_add_dependency(e, a, dep));
    CHECK(WAIT_UNTIL(atomic_load(&first.calls) == 1, FQT_LONG_MS));
    CHECK_EQ_INT(first.outcome, FQ_CANCELLED);
    CHECK_EQ_INT(first.status, FQ_ERR_DEPENDENCY);
    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&second.calls), 1);
    CHECK_EQ_INT(second.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(second.status, FQ_OK);
    rec_clear(&failing);
    rec_clear(&first);
    rec_clear(&second);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* submitted = succeeded + failed + cancelled + queued + running, also while
 * a carrier runs a shared GET whose first caller was cancelled: the carrier
 * was counted as running on top of its callers counted as queued (3
 * unfinished for 2; the scenario review). */
static void check_stats_add_up(fq_engine *e, const char *queue, const char *what) {
    const char *keys[] = {"succeeded", "failed", "cancelled", "queued", "running"};
    long long sum = 0, qsum = 0;
    for (int i = 0; i < 5; i++) {
        sum += fqt_stat(e, keys[i], -1);
        qsum += fqt_qstat(e, queue, keys[i], -1);
    }
    if (sum != fqt_stat(e, "submitted", -1) || qsum != fqt_qstat(e, queue, "submitted", -1))
        FAILF("%s: submitted %lld / %lld, ended + queued + running %lld / %lld (engine / queue)", what,
              (long long)fqt_stat(e, "submitted", -1), (long long)fqt_qstat(e, queue, "submitted", -1), sum, qsum);
}

TEST(http_stats_add_up_while_a_carrier_runs_a_shared_get) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 4);
    char req[400];
    fqt_get_request(&s, "/delay?ms=600", req, sizeof req);
    rec r[3];
    memset(r, 0, sizeof r);
    fq_op_id first = fqt_request(q, req, NULL, rec_done, &r[0]);
    REQUIRE(first > 0);
    REQUIRE(fqt_request(q, req, NULL, rec_done, &r[1]) > 0);
    REQUIRE(fqt_request(q, req, NULL, rec_done, &r[2]) > 0);
    REQUIRE(WAIT_UNTIL(fqt_stat(e, "running", -1) == 1, FQT_LONG_MS));
    check_stats_add_up(e, "q", "the first caller running the transfer");
    CHECK_OK(fq_cancel(e, first)); /* a carrier takes the running transfer over */
    CHECK(WAIT_UNTIL(atomic_load(&r[0].calls) == 1, FQT_LONG_MS));
    CHECK_EQ_INT(fqt_stat(e, "queued", -1), 2);
    CHECK_EQ_INT(fqt_stat(e, "running", -1), 0);
    check_stats_add_up(e, "q", "a carrier running it");
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(r[1].outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(r[2].outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(fqt_stat(e, "succeeded", -1), 2);
    check_stats_add_up(e, "q", "after the end");
    for (int i = 0; i < 3; i++) rec_clear(&r[i]);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* A request retried after its queue was suspended and freed: the retry came
 * back to the closed queue, still suspended, and nobody could resume it (the
 * fifth review): the operation and every caller sharing its GET from other
 * queues waited for ever. A freed queue is no longer suspended. */
TEST(http_a_retry_in_a_freed_suspended_queue_still_runs) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *doomed = fqt_queue(e, "doomed", 2), *live = fqt_queue(e, "live", 2);
    char req[400];
    fqt_get_request(&s, "/flaky?key=freed-suspended&fail=1&ms=150", req, sizeof req);
    const char *retry = "{\"retry\": {\"max\": 2, \"base\": 0.01}}";
    rec first = {0}, shared = {0};
    REQUIRE(fqt_request(doomed, req, retry, rec_done, &first) > 0);
    REQUIRE(fqt_request(live, req, retry, rec_done, &shared) > 0); /* shares the transfer */
    REQUIRE(WAIT_UNTIL(fqt_qstat(e, "doomed", "running", -1) == 1, FQT_LONG_MS));
    CHECK_OK(fq_queue_set_suspended(doomed, true));
    fq_queue_free(doomed); /* the first attempt (503) is still in flight */
    CHECK_OK(fq_queue_wait(live, FQT_LONG_MS));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&first.calls), 1);
    CHECK_EQ_INT(atomic_load(&shared.calls), 1);
    CHECK_EQ_INT(first.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(shared.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(json_integer_value(json_object_get(shared.value, "attempt")), 2);
    rec_clear(&first);
    rec_clear(&shared);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* The leading caller of a shared GET was cancelled while queued; the carrier
 * queued for the other callers waited for an open barrier of their queue,
 * which was waiting for those callers: nothing in that queue ever ran again
 * (the fifth review). A carrier does not wait for a barrier. */
TEST(http_a_shared_gets_carrier_does_not_wait_for_a_barrier_waiting_for_its_callers) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *held = fqt_queue(e, "held", 1), *q = fqt_queue(e, "q", 2);
    CHECK_OK(fq_queue_set_suspended(held, true));
    char req[400];
    fqt_get_request(&s, "/json?n=3", req, sizeof req);
    rec leader = {0}, caller = {0}, barrier = {0}, after = {0};
    fq_op_id lead = fqt_request(held, req, NULL, rec_done, &leader);
    REQUIRE(lead > 0);
    REQUIRE(fqt_request(q, req, NULL, rec_done, &caller) > 0); /* attaches to the leader's transfer */
    REQUIRE(fqt_block(q, body_tag, "{\"barrier\": true}", rec_done, &barrier) > 0);
    REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &after) > 0);
    CHECK_OK(fq_cancel(e, lead)); /* a carrier is queued in `q` for the caller */
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&leader.calls), 1);
    CHECK_EQ_INT(leader.outcome, FQ_CANCELLED);
    CHECK_EQ_INT(atomic_load(&caller.calls), 1);
    CHECK_EQ_INT(caller.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(atomic_load(&barrier.calls), 1);
    CHECK_EQ_INT(barrier.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(atomic_load(&after.calls), 1);
    CHECK_EQ_INT(after.outcome, FQ_SUCCEEDED);
    CHECK(caller.done_seq < barrier.done_seq); /* callbacks come in completion order */
    CHECK(atomic_load(&barrier.end_seq) < atomic_load(&after.start_seq));
    rec_clear(&leader);
    rec_clear(&caller);
    rec_clear(&barrier);
    rec_clear(&after);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* A barrier, then two identical GETs: the second shares the first's
 * transfer. The first cancelled, the carrier queued for the second waits
 * for the barrier, as both GETs did (the carrier had skipped every barrier:
 * the review of the session's own changes). */
TEST(http_a_carrier_for_callers_after_a_barrier_waits_for_it) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 4);
    char req[400];
    fqt_get_request(&s, "/json?n=2", req, sizeof req);
    rec barrier = {0}, first = {0}, second = {0};
    REQUIRE(fqt_async(q, body_async_capture, "{\"barrier\": true}", rec_done, &barrier) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&barrier.op) != NULL, FQT_LONG_MS));
    fq_op_id g1 = fqt_request(q, req, NULL, rec_done, &first);
    REQUIRE(g1 > 0);
    REQUIRE(fqt_request(q, req, NULL, rec_done, &second) > 0);
    CHECK_OK(fq_cancel(e, g1));
    CHECK(WAIT_UNTIL(atomic_load(&first.calls) == 1, FQT_LONG_MS));
    CHECK_EQ_INT(fq_queue_wait(q, 300), FQ_ERR_TIMEOUT); /* the barrier still runs */
    CHECK_EQ_INT(atomic_load(&second.calls), 0);
    CHECK_EQ_INT(fqt_finish_in_thread(atomic_load(&barrier.op), json_integer(1), NULL), FQ_OK);
    CHECK_OK(fq_queue_wait(q, FQT_LONG_MS));
    CHECK_EQ_INT(first.outcome, FQ_CANCELLED);
    CHECK_EQ_INT(barrier.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(atomic_load(&second.calls), 1);
    CHECK_EQ_INT(second.outcome, FQ_SUCCEEDED);
    CHECK(barrier.done_seq < second.done_seq);
    rec_clear(&barrier);
    rec_clear(&first);
    rec_clear(&second);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

TEST(http_coalesced_gets_exactly_once_under_cancels) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine("{\"max_per_host\": 8}");
    fq_queue *qs[3] = {fqt_queue(e, "a", 2), fqt_queue(e, "b", 2), fqt_queue(e, "c", 2)};
    fq_queue *held = fqt_queue(e, "held", 1);
    static const char *prio[3] = {"{\"priority\": -4}", NULL, "{\"priority\": 4}"};
    char url[256];
    for (int round = 0; round < CHURN_ROUNDS; round++) {
        int action = round % 6;
        netrec r[CHURN_OPS];
        memset(r, 0, sizeof r);
        fq_op_id id[CHURN_OPS];
        int cancel_rc[CHURN_OPS];
        for (int i = 0; i < CHURN_OPS; i++) cancel_rc[i] = -1;
        rec blocker;
        memset(&blocker, 0, sizeof blocker);
        fq_op_id blocker_id = 0;
        if (action == 5) {
            /* the first one stays queued: its queue is suspended */
            CHECK_OK(fq_queue_set_suspended(qs[round % 3], true));
            CHECK_OK(fq_queue_set_suspended(held, true));
            blocker_id = fqt_block(held, body_noop, NULL, rec_done, &blocker);
            REQUIRE(blocker_id > 0);
        }
        fqt_server_reset(&s);
        snprintf(url, sizeof url, "%s/delay?ms=40&round=%d", s.base, round);
        for (int i = 0; i < CHURN_OPS; i++) {
            id[i] = submit_url(qs[(i + round) % 3], NULL, url, prio[(i * 7 + round) % 3], &r[i]);
            REQUIRE(id[i] > 0);
        }
        switch (action) {
        case 1: cancel_rc[0] = fq_cancel(e, id[0]); break;
        case 2:
            CHECK(WAIT_UNTIL(fqt_server_stat(&s, "in_flight") >= 1, 5000));
            cancel_rc[0] = fq_cancel(e, id[0]);
            break;
        case 3:
            for (int i = 1; i < CHURN_OPS; i += 2) cancel_rc[i] = fq_cancel(e, id[i]);
            break;
        case 4:
            for (int i = CHURN_OPS - 1; i >= 0; i--) cancel_rc[i] = fq_cancel(e, id[i]);
            break;
        case 5:
            CHECK_OK(fq_add_dependency(e, id[0], blocker_id));
            /* the others finish without it, also the one attached from the
             * suspended queue */
            for (int i = 1; i < CHURN_OPS; i++) CHECK(WAIT_UNTIL(atomic_load(&r[i].r.calls) == 1, FQT_LONG_MS));
            CHECK_EQ_INT(atomic_load(&r[0].r.calls), 0);
            CHECK_OK(fq_queue_set_suspended(qs[round % 3], false));
            CHECK_OK(fq_queue_set_suspended(held, false));
            break;
        default: break;
        }
        CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
        for (int i = 0; i < CHURN_OPS; i++) {
            REQUIRE(atomic_load(&r[i].r.calls) == 1);
            if (cancel_rc[i] == FQ_OK) {
                if (r[i].r.outcome != FQ_CANCELLED)
                    FAILF("round %d (action %d) op %d: cancelled with FQ_OK but ended %d", round, action, i,
                          r[i].r.outcome);
            } else if (r[i].r.outcome != FQ_SUCCEEDED || fqt_int(r[i].r.value, "delayed", -1) != 40) {
                FAILF("round %d (action %d) op %d: outcome %d status %d %s (cancel %d)", round, action, i,
                      r[i].r.outcome, r[i].r.status, r[i].r.error, cancel_rc[i]);
            }
            netrec_clear(&r[i]);
        }
        long long requests = fqt_server_stat(&s, "requests");
        if (action == 4 ? requests > 1 : requests != (action == 5 ? 2 : 1))
            FAILF("round %d (action %d): the server saw %lld requests", round, action, requests);
        if (action == 5) {
            CHECK_EQ_INT(atomic_load(&blocker.calls), 1);
            rec_clear(&blocker);
        }
    }
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* fq_submit_requests: one operation per URL from one request object and one
 * options object; everything checked before anything is submitted. */
TEST(http_submit_requests_batch) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 4);
    enum { N = 150 }; /* more than two of the engine's 64-per-lock batches */
    char *urls[N];
    netrec *n = calloc(N, sizeof *n);
    void *uds[N];
    fq_op_id ids[N];
    REQUIRE(n != NULL);
    for (int i = 0; i < N; i++) {
        char path[64];
        snprintf(path, sizeof path, "/echo?i=%d", i);
        char buf[256];
        urls[i] = strdup(fqt_url(&s, path, buf, sizeof buf));
        uds[i] = &n[i];
        ids[i] = -100;
    }
    json_t *req = json_pack("{s:s, s:{s:s}, s:{s:s}, s:s}", "method", "POST", "headers", "X-Batch", "yes",
                            "query", "q", "a b", "body", "hi");
    json_t *opt = fqt_json("{\"priority\": 4, \"parse\": \"json\"}");
    fqt_server_reset(&s);
    CHECK_EQ_INT(fq_submit_requests(q, req, (const char *const *)urls, N, opt, net_done, uds, ids), N);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < N; i++) {
        char what[32];
        snprintf(what, sizeof what, "urls[%d]", i);
        if (i > 0 && ids[i] <= ids[i - 1]) FAILF("ids[%d] = %lld after %lld", i, (long long)ids[i],
                                                 (long long)ids[i - 1]);
        CHECK_EQ_INT(atomic_load(&n[i].r.calls), 1);
        CHECK_EQ_INT(n[i].r.id, ids[i]);
        expect(&n[i], FQ_SUCCEEDED, FQ_OK, what);
        json_t *v = n[i].r.value;
        REQUIRE(json_is_object(v));
        CHECK_JSTR(v, "method", "POST");
        CHECK_JSTR(v, "path", "/echo");
        CHECK_JSTR(v, "body", "hi");
        CHECK_JSTR(json_object_get(v, "headers"), "x-batch", "yes");
        char want[64];
        snprintf(want, sizeof want, "{\"i\": \"%d\", \"q\": \"a b\"}", i);
        check_json_eq(json_object_get(v, "query"), want, what);
        netrec_clear(&n[i]);
    }
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), N);
    memset(n, 0, N * sizeof *n);
    json_decref(req);
    json_decref(opt);

    /* a NULL request is a GET; NULL userdata and ids; no callback */
    fqt_server_reset(&s);
    CHECK_EQ_INT(fq_submit_requests(q, NULL, (const char *const *)urls, 3, NULL, NULL, NULL, NULL), 3);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), 3);
    CHECK_EQ_INT(fq_submit_requests(q, NULL, NULL, 0, NULL, net_done, NULL, NULL), 0);

    /* rejected before anything is submitted: no request, no callback */
    long long submitted_before = fqt_stat(e, "submitted", -1);
    fqt_server_reset(&s);
    char *saved = urls[2];
    urls[2] = (char *)"ftp://127.0.0.1/x";
    CHECK_EQ_INT(fq_submit_requests(q, NULL, (const char *const *)urls, N, NULL, net_done, uds, ids), FQ_ERR_INVALID);
    CHECK_CONTAINS(fq_last_error(), "urls[2]");
    urls[2] = NULL;
    CHECK_EQ_INT(fq_submit_requests(q, NULL, (const char *const *)urls, N, NULL, net_done, uds, ids), FQ_ERR_INVALID);
    CHECK_CONTAINS(fq_last_error(), "urls[2] is NULL");
    urls[2] = saved;
    json_t *with_url = json_pack("{s:s}", "url", urls[0]);
    CHECK_EQ_INT(fq_submit_requests(q, with_url, (const char *const *)urls, 2, NULL, net_done, uds, ids),
                 FQ_ERR_INVALID);
    CHECK_CONTAINS(fq_last_error(), "request.url");
    json_decref(with_url);
    json_t *bogus = fqt_json("{\"bogus_option\": 1}");
    CHECK_EQ_INT(fq_submit_requests(q, NULL, (const char *const *)urls, 2, bogus, net_done, uds, ids),
                 FQ_ERR_INVALID);
    CHECK_CONTAINS(fq_last_error(), "bogus_option");
    json_decref(bogus);
    json_t *bad_header = json_pack("{s:{s:s}}", "headers", "X-A", "a\r\nb");
    CHECK_EQ_INT(fq_submit_requests(q, bad_header, (const char *const *)urls, 2, NULL, net_done, uds, ids),
                 FQ_ERR_INVALID);
    json_decref(bad_header);
    CHECK_EQ_INT(fq_submit_requests(NULL, NULL, (const char *const *)urls, 2, NULL, net_done, uds, ids),
                 FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_submit_requests(q, NULL, NULL, 2, NULL, net_done, uds, ids), FQ_ERR_INVALID);
    CHECK_EQ_INT(fq_submit_requests(q, NULL, (const char *const *)urls, (size_t)-1, NULL, net_done, uds, ids),
                 FQ_ERR_INVALID);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < N; i++) CHECK_EQ_INT(atomic_load(&n[i].r.calls), 0);
    CHECK_EQ_INT(fqt_stat(e, "submitted", -1), submitted_before);
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), 0);

    /* identical GETs in one batch share one transfer, as separate submits do */
    fqt_server_reset(&s);
    const char *same[4] = {urls[7], urls[7], urls[7], urls[7]};
    CHECK_EQ_INT(fq_submit_requests(q, NULL, same, 4, NULL, net_done, uds, ids), 4);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(atomic_load(&n[i].r.calls), 1);
        expect(&n[i], FQ_SUCCEEDED, FQ_OK, "a coalesced GET of the batch");
        netrec_clear(&n[i]);
    }
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), 1);

    for (int i = 0; i < N; i++) free(urls[i]);
    free(n);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* The first caller of a shared GET is cancelled at a random moment while
 * its transfer is retried: the second caller still gets the transfer's
 * answer, retried (the ninth review found, about once in a thousand
 * rounds each: the cancel arriving while the retry's transfer was being
 * started aborted it, and the second caller ended cancelled; the cancel
 * arriving while the failed attempt was being looked at ended the second
 * caller with that attempt, not retried). */
TEST_T(http_a_cancelled_first_callers_retried_transfer_goes_on_for_the_other, 120) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 8);
    const char *opts = "{\"retry\": {\"max\": 1, \"base\": 0, \"max_delay\": 0}}";
    unsigned seed = 7;
    char url[256];
    int leader_cancelled = 0;
    for (int round = 0; round < 1500; round++) {
        snprintf(url, sizeof url, "%s/flaky?key=leader-%d&fail=1&ms=1", s.base, round);
        netrec a, b;
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        /* Submitted while the queue is suspended, so that b is sure to join
         * a's transfer: a's submit starts its transfer itself, and when the
         * submitting thread lost its CPU after that (inside a's submit or
         * before b's) for longer than a's two attempts took (about 2-3 ms;
         * under the sanitizers on a loaded machine), b made a GET of its own
         * and got attempt 3, rightly. */
        REQUIRE(fq_queue_set_suspended(q, true) == FQ_OK);
        fq_op_id ida = submit_url(q, NULL, url, opts, &a);
        fq_op_id idb = submit_url(q, NULL, url, opts, &b);
        REQUIRE(ida > 0 && idb > 0);
        REQUIRE(fq_queue_set_suspended(q, false) == FQ_OK);
        usleep((useconds_t)(rand_r(&seed) % 3000));
        int rc_cancel = fq_cancel(e, ida);
        if (rc_cancel == FQ_OK) leader_cancelled++;
        CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
        REQUIRE(atomic_load(&a.r.calls) == 1 && atomic_load(&b.r.calls) == 1);
        if (b.r.outcome != FQ_SUCCEEDED || fqt_int(b.r.value, "attempt", -1) != 2)
            FAILF("round %d: the second caller ended %d, status %d, %s, attempt %lld (first caller %d, status %d, "
                  "attempt %lld; its cancel returned %d)",
                  round, b.r.outcome, b.r.status, b.r.error, fqt_int(b.r.value, "attempt", -1), a.r.outcome,
                  a.r.status, fqt_int(a.r.value, "attempt", -1), rc_cancel);
        netrec_clear(&a);
        netrec_clear(&b);
    }
    CHECK(leader_cancelled > 500); /* most cancels found the first caller running or waiting */
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* max_wait_ms is the time from the submit to the start: an operation that
 * started, failed and waits for a slot to be tried again is past it (the
 * ninth review: it ended FQ_ERR_QUEUE_TIMEOUT although its request had been
 * answered, when it had waited for a slot before its first start). */
TEST(http_max_wait_ms_does_not_end_an_operation_that_started) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    char url[256];
    netrec blocker, a, b;
    memset(&blocker, 0, sizeof blocker);
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    REQUIRE(submit_url(q, NULL, fqt_url(&s, "/delay?ms=800&n=1", url, sizeof url), NULL, &blocker) > 0);
    REQUIRE(submit_url(q, NULL, fqt_url(&s, "/flaky?key=maxwait-start&fail=1", url, sizeof url),
                       "{\"max_wait_ms\": 1500, \"retry\": {\"max\": 1, \"base\": 0}}", &a) > 0);
    /* takes the slot while a waits to be tried again, until after a's limit */
    REQUIRE(submit_url(q, NULL, fqt_url(&s, "/delay?ms=2000&n=2", url, sizeof url), NULL, &b) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(blocker.r.outcome, FQ_SUCCEEDED);
    CHECK_EQ_INT(b.r.outcome, FQ_SUCCEEDED);
    if (a.r.outcome != FQ_SUCCEEDED)
        FAILF("a: outcome %d, status %d, %s", a.r.outcome, a.r.status, a.r.error);
    CHECK_EQ_INT(fqt_int(a.r.value, "attempt", -1), 2);
    netrec_clear(&blocker);
    netrec_clear(&a);
    netrec_clear(&b);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* A GET that joins a queued identical GET counts its max_wait_ms from its
 * own submit (the ninth review: it ended FQ_ERR_QUEUE_TIMEOUT with the
 * first one, 1.5 s early). */
TEST(http_a_joining_get_has_its_own_max_wait_ms) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    char url[256];
    netrec blocker, first, joiner;
    memset(&blocker, 0, sizeof blocker);
    memset(&first, 0, sizeof first);
    memset(&joiner, 0, sizeof joiner);
    const char *wait = "{\"max_wait_ms\": 2000}";
    REQUIRE(submit_url(q, NULL, fqt_url(&s, "/delay?ms=2750&n=3", url, sizeof url), NULL, &blocker) > 0);
    fqt_url(&s, "/json?size=100&joined=1", url, sizeof url);
    REQUIRE(submit_url(q, NULL, url, wait, &first) > 0);
    usleep(1500 * 1000);
    REQUIRE(submit_url(q, NULL, url, wait, &joiner) > 0); /* joins: same GET, same max_wait_ms */
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(first.r.outcome, FQ_FAILED);
    CHECK_EQ_INT(first.r.status, FQ_ERR_QUEUE_TIMEOUT);
    /* its own limit ends 3.5 s after the first's submit, after the blocker */
    if (joiner.r.outcome != FQ_SUCCEEDED)
        FAILF("joiner: outcome %d, status %d, %s", joiner.r.outcome, joiner.r.status, joiner.r.error);
    CHECK(json_is_object(joiner.r.value));
    netrec_clear(&blocker);
    netrec_clear(&first);
    netrec_clear(&joiner);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}
