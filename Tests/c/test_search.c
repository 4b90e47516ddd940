/* Searches and fan-out searches against the shared test server's corpus:
 * every expected result is computed independently from /corpus?tag=T (read
 * over a plain socket), never from /search. One server per test (see fqt.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fqt.h"

static const char *const TAGS[] = {"swift", "c", "python", "rust", "go", "json", "http", "queue"};
enum { NTAGS = sizeof TAGS / sizeof TAGS[0] };

/* An engine whose "search" config points at the server, plus extra config
 * members (text, may be NULL). */
static fq_engine *search_engine(const fqt_server *s, const char *extra_config) {
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"search\": {\"url\": \"%s/search?q={query}&rpp=500\", \"results\": \"/results\", "
             "\"id\": \"/id\", \"sort\": \"/created_at\", \"order\": \"desc\"}%s%s}",
             s->base, extra_config ? ", " : "", extra_config ? extra_config : "");
    return fqt_engine(cfg);
}

/* /corpus?tag=T (or ?q=Q with by_query) from the server: NEW reference to
 * its "results" array; REQUIREs that "count" matches its size. */
static json_t *corpus(const fqt_server *s, const char *key, const char *value) {
    char enc[512], target[700];
    snprintf(target, sizeof target, "/corpus?%s=%s", key, fqt_pct(value, enc, sizeof enc));
    json_t *doc = fqt_server_json(s, target);
    json_t *res = json_object_get(doc, "results");
    REQUIRE(json_is_array(res));
    REQUIRE(fqt_int(doc, "count", -1) == (long long)json_array_size(res));
    json_incref(res);
    json_decref(doc);
    return res;
}

/* How many /search requests the server has seen (/corpus ones are counted too,
 * so "requests" would not do). */
static long long search_requests(const fqt_server *s) {
    json_t *st = fqt_server_stats(s);
    long long v = fqt_int(json_object_get(st, "by_path"), "/search", 0);
    json_decref(st);
    return v;
}

static const char *item_id(const json_t *item) {
    return json_string_value(json_object_get(item, "id"));
}

static const char *item_date(const json_t *item) {
    return json_string_value(json_object_get(item, "created_at"));
}

/* An object used as a set of ids (values: the items). */
static void add_ids(json_t *set, const json_t *items) {
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it) {
        const char *id = item_id(it);
        REQUIRE(id != NULL);
        if (!json_object_get(set, id)) json_object_set(set, id, it);
    }
}

/* CHECKs that `items` holds exactly the items of `want` (an id set), each
 * once and equal to the corpus item, sorted strictly by created_at in the
 * given direction. */
static void check_items(const json_t *items, const json_t *want, bool desc, const char *what) {
    if (!json_is_array(items)) {
        FAILF("%s: items is not an array", what);
        return;
    }
    if (json_array_size(items) != json_object_size(want))
        FAILF("%s: %zu items, expected %zu", what, json_array_size(items),
              json_object_size(want));
    json_t *seen = json_object();
    const char *prev = NULL;
    bool misordered = false;
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it) {
        const char *id = item_id(it), *date = item_date(it);
        if (!id || !date) {
            FAILF("%s: item %zu has no id or created_at", what, i);
            continue;
        }
        if (json_object_get(seen, id)) FAILF("%s: %s appears twice", what, id);
        json_object_set_new(seen, id, json_true());
        json_t *w = json_object_get(want, id);
        if (!w) FAILF("%s: unexpected item %s", what, id);
        else if (!json_equal(w, it)) FAILF("%s: item %s differs from the corpus", what, id);
        if (prev && !misordered) {
            int c = strcmp(prev, date);
            if (desc ? c <= 0 : c >= 0) {
                FAILF("%s: not strictly %s by created_at: item %zu has %s, the one before %s",
                      what, desc ? "descending" : "ascending", i, date, prev);
                misordered = true; /* reported once per list */
            }
        }
        prev = date;
    }
    json_decref(seen);
}

static void expect(const netrec *n, int outcome, int status, const char *what) {
    if (n->r.outcome != outcome || n->r.status != status)
        FAILF("%s: outcome %d status %d (%s), expected outcome %d status %d (%s); error: %s",
              what, n->r.outcome, n->r.status, fq_strerror(n->r.status), outcome, status,
              fq_strerror(status), n->r.error);
}

static fq_op_id search(fq_queue *q, const char *query, const char *options_text, netrec *n) {
    json_t *o = options_text ? fqt_json(options_text) : NULL;
    fq_op_id id = fq_submit_search(q, query, o, net_done, n);
    if (id <= 0) FAILF("fq_submit_search(%s, %s): %lld %s", query,
                       options_text ? options_text : "NULL", (long long)id, fq_last_error());
    json_decref(o);
    return id;
}

static fq_op_id search_all(fq_queue *q, const char *const *queries, size_t nq,
                           const char *options_text, netrec *n) {
    json_t *o = options_text ? fqt_json(options_text) : NULL;
    fq_op_id id = fq_submit_search_all(q, queries, nq, o, net_done, n);
    if (id <= 0) FAILF("fq_submit_search_all(%zu queries, %s): %lld %s", nq,
                       options_text ? options_text : "NULL", (long long)id, fq_last_error());
    json_decref(o);
    return id;
}

/* ------------------------------------------------------------------ */

TEST(search_each_tag_sorted_desc_matches_corpus) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = search_engine(&s, NULL);
    fq_queue *q = fqt_queue(e, "q", 4);
    netrec n[NTAGS + 1];
    memset(n, 0, sizeof n);
    for (int i = 0; i < NTAGS; i++) REQUIRE(search(q, TAGS[i], NULL, &n[i]) > 0);
    /* a text phrase: encoded with %20 into {query} */
    const char *phrase = "memory stays flat";
    REQUIRE(search(q, phrase, NULL, &n[NTAGS]) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i <= NTAGS; i++) {
        const char *qs = i < NTAGS ? TAGS[i] : phrase;
        CHECK_EQ_INT(atomic_load(&n[i].r.calls), 1);
        expect(&n[i], FQ_SUCCEEDED, FQ_OK, qs);
        CHECK_EQ_INT(n[i].http_status, 200);
        json_t *v = n[i].r.value;
        REQUIRE(json_is_object(v));
        CHECK_EQ_INT(json_object_size(v), 3);
        CHECK(json_is_string(json_object_get(v, "query")) &&
              strcmp(json_string_value(json_object_get(v, "query")), qs) == 0);
        json_t *want_items = corpus(&s, i < NTAGS ? "tag" : "q", qs);
        CHECK(json_array_size(want_items) > 0);
        CHECK_EQ_INT(fqt_int(v, "count", -1), (long long)json_array_size(want_items));
        json_t *want = json_object();
        add_ids(want, want_items);
        check_items(json_object_get(v, "items"), want, true, qs);
        json_decref(want);
        json_decref(want_items);
        netrec_clear(&n[i]);
    }
    /* the request targets */
    json_t *st = fqt_server_stats(&s);
    json_t *arr = json_object_get(st, "arrivals");
    CHECK_EQ_INT(fqt_int(json_object_get(st, "by_path"), "/search", 0), NTAGS + 1);
    bool phrase_seen = false;
    size_t k;
    json_t *t;
    json_array_foreach(arr, k, t) {
        if (json_is_string(t) &&
            strcmp(json_string_value(t), "/search?q=memory%20stays%20flat&rpp=500") == 0)
            phrase_seen = true;
    }
    if (!phrase_seen) {
        char *d = json_dumps(arr, 0);
        FAILF("no arrival /search?q=memory%%20stays%%20flat&rpp=500 in %s", d);
        free(d);
    }
    json_decref(st);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

TEST(search_option_overrides) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = search_engine(&s, NULL);
    fq_queue *q = fqt_queue(e, "q", 4);
    netrec asc, byid, none, nocfg;
    memset(&asc, 0, sizeof asc);
    memset(&byid, 0, sizeof byid);
    memset(&none, 0, sizeof none);
    REQUIRE(search(q, "swift", "{\"order\": \"asc\"}", &asc) > 0);
    REQUIRE(search(q, "rust", "{\"sort\": \"/id\", \"order\": \"asc\"}", &byid) > 0);
    REQUIRE(search(q, "zzzz-nothing", NULL, &none) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));

    expect(&asc, FQ_SUCCEEDED, FQ_OK, "order asc");
    json_t *want_items = corpus(&s, "tag", "swift");
    json_t *want = json_object();
    add_ids(want, want_items);
    CHECK_EQ_INT(fqt_int(asc.r.value, "count", -1), (long long)json_array_size(want_items));
    check_items(json_object_get(asc.r.value, "items"), want, false, "order asc");
    json_decref(want);
    json_decref(want_items);

    expect(&byid, FQ_SUCCEEDED, FQ_OK, "sort /id asc");
    json_t *items = json_object_get(byid.r.value, "items");
    want_items = corpus(&s, "tag", "rust");
    CHECK_EQ_INT(json_array_size(items), json_array_size(want_items));
    for (size_t i = 1; i < json_array_size(items); i++) {
        const char *a = item_id(json_array_get(items, i - 1));
        const char *b = item_id(json_array_get(items, i));
        if (!a || !b || strcmp(a, b) >= 0) FAILF("sort /id asc: %s then %s", a, b);
    }
    json_decref(want_items);

    expect(&none, FQ_SUCCEEDED, FQ_OK, "no match");
    CHECK_EQ_INT(fqt_int(none.r.value, "count", -1), 0);
    CHECK(json_is_array(json_object_get(none.r.value, "items")) &&
          json_array_size(json_object_get(none.r.value, "items")) == 0);
    netrec_clear(&asc);
    netrec_clear(&byid);
    netrec_clear(&none);
    fqt_engine_free(e);

    /* no engine "search" config: the options carry the whole endpoint */
    e = fqt_engine(NULL);
    q = fqt_queue(e, "q", 1);
    memset(&nocfg, 0, sizeof nocfg);
    char opts[512];
    snprintf(opts, sizeof opts,
             "{\"url\": \"%s/search?rpp=500&q={query}\", \"results\": \"/results\", "
             "\"sort\": \"/created_at\", \"order\": \"asc\"}",
             s.base);
    REQUIRE(search(q, "go", opts, &nocfg) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    expect(&nocfg, FQ_SUCCEEDED, FQ_OK, "search with url in the options");
    want_items = corpus(&s, "tag", "go");
    want = json_object();
    add_ids(want, want_items);
    check_items(json_object_get(nocfg.r.value, "items"), want, false, "url in the options");
    json_decref(want);
    json_decref(want_items);
    netrec_clear(&nocfg);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

TEST(search_failures) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = search_engine(&s, NULL);
    fq_queue *q = fqt_queue(e, "q", 4);
    enum { NF = 5 };
    netrec n[NF];
    memset(n, 0, sizeof n);
    REQUIRE(search(q, "__fail", NULL, &n[0]) > 0);
    REQUIRE(search(q, "__bad", NULL, &n[1]) > 0);
    REQUIRE(search(q, "swift", "{\"results\": \"/nope\"}", &n[2]) > 0);
    REQUIRE(search(q, "__notarray", NULL, &n[3]) > 0);
    REQUIRE(search(q, "__slow", "{\"timeout_ms\": 100}", &n[4]) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < NF; i++) {
        CHECK_EQ_INT(atomic_load(&n[i].r.calls), 1);
        CHECK(n[i].r.has_error);
    }
    expect(&n[0], FQ_FAILED, FQ_ERR_HTTP, "__fail");
    CHECK_EQ_INT(n[0].http_status, 500);
    expect(&n[1], FQ_FAILED, FQ_ERR_PARSE, "__bad");
    CHECK_EQ_INT(n[1].http_status, 200);
    expect(&n[2], FQ_FAILED, FQ_ERR_PARSE, "results /nope");
    CHECK_EQ_INT(n[2].http_status, 200);
    expect(&n[3], FQ_FAILED, FQ_ERR_PARSE, "__notarray");
    expect(&n[4], FQ_FAILED, FQ_ERR_TIMEOUT, "__slow with timeout_ms 100");
    for (int i = 0; i < NF; i++) netrec_clear(&n[i]);

    /* rejected at submit, never called back */
    static const char *const bad[] = {
        "{\"order\": \"sideways\"}",
        "{\"sort\": 5}",
        "{\"bogus_option\": true}",
        "{\"results\": \"no-leading-slash\"}",
        "{\"url\": \"ftp://127.0.0.1/{query}\"}",
    };
    netrec never;
    memset(&never, 0, sizeof never);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *o = fqt_json(bad[i]);
        fq_op_id id = fq_submit_search(q, "swift", o, net_done, &never);
        if (id != FQ_ERR_INVALID)
            FAILF("fq_submit_search with %s returned %lld, expected FQ_ERR_INVALID", bad[i],
                  (long long)id);
        json_decref(o);
    }
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&never.r.calls), 0);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* ------------------------------------------------------------------ */
/* Fan-out searches                                                     */

/* The expected merged id set for the queries that are tags. */
static json_t *union_of(const fqt_server *s, const char *const *tags, size_t n) {
    json_t *set = json_object();
    for (size_t i = 0; i < n; i++) {
        if (strncmp(tags[i], "__", 2) == 0) continue;
        json_t *items = corpus(s, "tag", tags[i]);
        add_ids(set, items);
        json_decref(items);
    }
    return set;
}

static long long corpus_count(const fqt_server *s, const char *tag) {
    json_t *items = corpus(s, "tag", tag);
    long long c = (long long)json_array_size(items);
    json_decref(items);
    return c;
}

TEST(search_all_merges_and_deduplicates) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = search_engine(&s, NULL);
    fq_queue *q = fqt_queue(e, "q", 3);
    const char *tags[] = {"swift", "c", "go", "rust"};
    netrec n;
    memset(&n, 0, sizeof n);
    fq_op_id id = search_all(q, tags, 4, NULL, &n);
    REQUIRE(id > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&n.r.calls), 1);
    CHECK_EQ_INT(n.r.id, id);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "search_all");
    json_t *v = n.r.value;
    REQUIRE(json_is_object(v));
    json_t *want = union_of(&s, tags, 4);
    long long sum = 0;
    for (int i = 0; i < 4; i++) sum += corpus_count(&s, tags[i]);
    /* the tags overlap, so de-duplication is visible */
    CHECK((long long)json_object_size(want) < sum);
    CHECK_EQ_INT(fqt_int(v, "count", -1), (long long)json_object_size(want));
    check_items(json_object_get(v, "items"), want, true, "merged");
    json_t *qs = json_object_get(v, "queries");
    REQUIRE(json_is_object(qs));
    CHECK_EQ_INT(json_object_size(qs), 4);
    for (int i = 0; i < 4; i++) {
        char w[64];
        snprintf(w, sizeof w, "{\"count\": %lld}", corpus_count(&s, tags[i]));
        json_t *wj = fqt_json(w);
        json_t *got = json_object_get(qs, tags[i]);
        if (!json_equal(got, wj)) {
            char *d = got ? json_dumps(got, 0) : NULL;
            FAILF("queries[%s] is %s, expected %s", tags[i], d ? d : "absent", w);
            free(d);
        }
        json_decref(wj);
    }
    json_decref(want);
    netrec_clear(&n);
    CHECK_EQ_INT(fqt_stat(e, "submitted", -1), 5);
    CHECK_EQ_INT(fqt_stat(e, "succeeded", -1), 5);
    CHECK_EQ_INT(search_requests(&s), 4);

    /* repeated queries: one child per distinct query */
    const char *dup[] = {"swift", "go", "swift"};
    memset(&n, 0, sizeof n);
    fqt_server_reset(&s);
    REQUIRE(search_all(q, dup, 3, NULL, &n) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&n.r.calls), 1);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "search_all with a repeated query");
    want = union_of(&s, dup, 3);
    CHECK_EQ_INT(fqt_int(n.r.value, "count", -1), (long long)json_object_size(want));
    check_items(json_object_get(n.r.value, "items"), want, true, "repeated query");
    CHECK_EQ_INT(json_object_size(json_object_get(n.r.value, "queries")), 2);
    json_decref(want);
    netrec_clear(&n);
    CHECK_EQ_INT(search_requests(&s), 2);
    CHECK_EQ_INT(fqt_stat(e, "submitted", -1), 5 + 3);

    /* rejected at submit, never called back: "barrier", a bad option, NULL */
    netrec never;
    memset(&never, 0, sizeof never);
    json_t *o = fqt_json("{\"barrier\": true}");
    CHECK_EQ_INT(fq_submit_search_all(q, tags, 4, o, net_done, &never), FQ_ERR_INVALID);
    json_decref(o);
    o = fqt_json("{\"fail_fast\": 1}");
    CHECK_EQ_INT(fq_submit_search_all(q, tags, 4, o, net_done, &never), FQ_ERR_INVALID);
    json_decref(o);
    CHECK_EQ_INT(fq_submit_search_all(q, NULL, 2, NULL, net_done, &never), FQ_ERR_INVALID);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&never.r.calls), 0);
    CHECK_EQ_INT(fqt_stat(e, "submitted", -1), 5 + 3);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

TEST(search_all_partial_failure_and_fail_fast) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = search_engine(&s, NULL);
    fq_queue *q = fqt_queue(e, "q", 4);
    const char *qs[] = {"swift", "__fail", "go", "__bad"};
    netrec n;
    memset(&n, 0, sizeof n);
    REQUIRE(search_all(q, qs, 4, NULL, &n) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&n.r.calls), 1);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "partial search_all");
    json_t *v = n.r.value;
    REQUIRE(json_is_object(v));
    json_t *want = union_of(&s, qs, 4);
    CHECK_EQ_INT(fqt_int(v, "count", -1), (long long)json_object_size(want));
    check_items(json_object_get(v, "items"), want, true, "partial");
    json_decref(want);
    json_t *queries = json_object_get(v, "queries");
    CHECK_EQ_INT(json_object_size(queries), 4);
    json_t *f = json_object_get(queries, "__fail");
    REQUIRE(json_is_object(f));
    CHECK_EQ_INT(json_object_size(f), 3);
    CHECK(json_is_string(json_object_get(f, "error")) &&
          json_string_length(json_object_get(f, "error")) > 0);
    CHECK_EQ_INT(fqt_int(f, "status", 0), FQ_ERR_HTTP);
    CHECK_EQ_INT(fqt_int(f, "http_status", 0), 500);
    json_t *b = json_object_get(queries, "__bad");
    REQUIRE(json_is_object(b));
    CHECK(json_is_string(json_object_get(b, "error")));
    CHECK_EQ_INT(fqt_int(b, "status", 0), FQ_ERR_PARSE);
    CHECK(json_object_get(b, "count") == NULL);
    CHECK_EQ_INT(fqt_int(json_object_get(queries, "swift"), "count", -1),
                 corpus_count(&s, "swift"));
    CHECK_EQ_INT(fqt_int(json_object_get(queries, "go"), "count", -1), corpus_count(&s, "go"));
    netrec_clear(&n);
    CHECK_EQ_INT(fqt_stat(e, "failed", -1), 2);
    CHECK_EQ_INT(fqt_stat(e, "succeeded", -1), 3);

    /* fail_fast: the parent fails with the failing query's status */
    const char *ff[] = {"__fail", "swift", "go"};
    memset(&n, 0, sizeof n);
    REQUIRE(search_all(q, ff, 3, "{\"fail_fast\": true}", &n) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&n.r.calls), 1);
    expect(&n, FQ_FAILED, FQ_ERR_HTTP, "fail_fast search_all");
    CHECK(n.r.has_error);
    netrec_clear(&n);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

TEST(search_all_cancel_parent) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    const char *qs[] = {"swift", "c", "go", "rust"};
    enum { NQ = 4 };

    /* not started: the queue is suspended */
    fq_engine *e = search_engine(&s, NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    CHECK_OK(fq_queue_set_suspended(q, true));
    netrec n;
    memset(&n, 0, sizeof n);
    fq_op_id id = search_all(q, qs, NQ, NULL, &n);
    REQUIRE(id > 0);
    CHECK_EQ_INT(fqt_stat(e, "submitted", -1), NQ + 1);
    CHECK_OK(fq_cancel(e, id));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&n.r.calls), 1);
    CHECK_EQ_INT(n.r.id, id);
    expect(&n, FQ_CANCELLED, FQ_ERR_CANCELLED, "cancelled search_all (suspended)");
    CHECK_EQ_INT(fqt_stat(e, "cancelled", -1), NQ + 1);
    CHECK_EQ_INT(fqt_qstat(e, "q", "cancelled", -1), NQ + 1);
    CHECK_EQ_INT(fqt_stat(e, "queued", -1), 0);
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), 0);
    netrec_clear(&n);
    CHECK_OK(fq_queue_set_suspended(q, false));
    fqt_engine_free(e);

    /* children in flight: every child stalls; max_concurrent 2 */
    e = search_engine(&s, NULL);
    q = fqt_queue(e, "q", 2);
    memset(&n, 0, sizeof n);
    char opts[256];
    snprintf(opts, sizeof opts, "{\"url\": \"%s/stall?q={query}\"}", s.base);
    id = search_all(q, qs, NQ, opts, &n);
    REQUIRE(id > 0);
    bool two = WAIT_UNTIL(fqt_server_stat(&s, "in_flight") == 2, FQT_LONG_MS);
    REQUIRE(two);
    CHECK_EQ_INT(atomic_load(&n.r.calls), 0);
    CHECK_OK(fq_cancel(e, id));
    CHECK(WAIT_UNTIL(atomic_load(&n.r.calls) == 1, FQT_LONG_MS));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&n.r.calls), 1);
    expect(&n, FQ_CANCELLED, FQ_ERR_CANCELLED, "cancelled search_all (in flight)");
    CHECK_EQ_INT(fqt_stat(e, "cancelled", -1), NQ + 1);
    CHECK_EQ_INT(fqt_stat(e, "running", -1), 0);
    CHECK(WAIT_UNTIL(fqt_server_stat(&s, "open_connections") == 0, 10000));
    CHECK_EQ_INT(fqt_server_stat(&s, "in_flight"), 0);
    /* the two that never started never reached the server */
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), 2);
    netrec_clear(&n);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* Child events */

#define MAX_CHILD_EVENTS 64

typedef struct {
    int type;
    fq_op_id parent, child;
    char query[64];
    int outcome, status;
    long http_status;
    long long count;
    json_t *value; /* kept */
    long seq;
} child_ev;

typedef struct {
    pthread_mutex_t mu;
    int n;
    child_ev ev[MAX_CHILD_EVENTS];
} child_log;

static void on_child_event(const fq_event *ev, void *userdata) {
    child_log *log = userdata;
    child_ev c;
    memset(&c, 0, sizeof c);
    c.type = (int)fq_event_get_type(ev);
    c.parent = fq_event_op_id(ev);
    const fq_result *r = fq_event_result(ev);
    const char *q = fq_event_query(ev);
    snprintf(c.query, sizeof c.query, "%s", q ? q : "(null)");
    if (r) {
        c.child = fq_result_op_id(r);
        c.outcome = (int)fq_result_outcome(r);
        c.status = fq_result_status(r);
        c.http_status = fq_result_http_status(r);
        json_t *v = fq_result_value(r);
        c.value = v ? json_incref(v) : NULL;
        c.count = fqt_int(v, "count", -1);
    }
    c.seq = fqt_seq();
    pthread_mutex_lock(&log->mu);
    if (log->n < MAX_CHILD_EVENTS) log->ev[log->n++] = c;
    else json_decref(c.value);
    pthread_mutex_unlock(&log->mu);
}

TEST(search_all_child_events_before_parent) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = search_engine(&s, NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    child_log *log = calloc(1, sizeof *log);
    REQUIRE(log != NULL);
    pthread_mutex_init(&log->mu, NULL);
    CHECK_OK(fq_engine_set_event_fn(e, on_child_event, log));

    /* without "child_events": no events */
    const char *one[] = {"json"};
    netrec n;
    memset(&n, 0, sizeof n);
    REQUIRE(search_all(q, one, 1, NULL, &n) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    expect(&n, FQ_SUCCEEDED, FQ_OK, "search_all without child events");
    netrec_clear(&n);
    pthread_mutex_lock(&log->mu);
    CHECK_EQ_INT(log->n, 0);
    pthread_mutex_unlock(&log->mu);

    const char *qs[] = {"swift", "__fail", "go"};
    enum { NQ = 3 };
    memset(&n, 0, sizeof n);
    fq_op_id id = search_all(q, qs, NQ, "{\"child_events\": true}", &n);
    REQUIRE(id > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&n.r.calls), 1);
    expect(&n, FQ_SUCCEEDED, FQ_OK, "search_all with child events");

    pthread_mutex_lock(&log->mu);
    int at_idle = log->n;
    pthread_mutex_unlock(&log->mu);
    if (at_idle != NQ) {
        /* tell a late event from a lost one */
        FAILF("%d child events when fq_engine_wait_idle returned, expected %d", at_idle, NQ);
        fqt_sleep_ms(1000);
    }
    pthread_mutex_lock(&log->mu);
    CHECK_EQ_INT(log->n, NQ);
    bool seen[NQ] = {false};
    for (int i = 0; i < log->n; i++) {
        child_ev *c = &log->ev[i];
        CHECK_EQ_INT(c->type, FQ_EVENT_CHILD);
        CHECK_EQ_INT(c->parent, id);
        CHECK(c->child > 0 && c->child != id);
        for (int j = 0; j < i; j++)
            if (log->ev[j].child == c->child) FAILF("child id %lld twice", (long long)c->child);
        if (c->seq >= n.r.done_seq) FAILF("child event %d (%s) after the parent's callback", i,
                                          c->query);
        int k = -1;
        for (int j = 0; j < NQ; j++)
            if (strcmp(c->query, qs[j]) == 0) k = j;
        if (k < 0) {
            FAILF("child event for unknown query %s", c->query);
            continue;
        }
        if (seen[k]) FAILF("two child events for %s", c->query);
        seen[k] = true;
        if (strcmp(c->query, "__fail") == 0) {
            CHECK_EQ_INT(c->outcome, FQ_FAILED);
            CHECK_EQ_INT(c->status, FQ_ERR_HTTP);
            CHECK_EQ_INT(c->http_status, 500);
        } else {
            CHECK_EQ_INT(c->outcome, FQ_SUCCEEDED);
            CHECK_EQ_INT(c->status, FQ_OK);
            CHECK_EQ_INT(c->http_status, 200);
            CHECK_EQ_INT(c->count, corpus_count(&s, c->query));
            CHECK(json_is_string(json_object_get(c->value, "query")) &&
                  strcmp(json_string_value(json_object_get(c->value, "query")), c->query) == 0);
            json_t *items = corpus(&s, "tag", c->query);
            json_t *want = json_object();
            add_ids(want, items);
            check_items(json_object_get(c->value, "items"), want, true, c->query);
            json_decref(want);
            json_decref(items);
        }
        json_decref(c->value);
        c->value = NULL;
    }
    pthread_mutex_unlock(&log->mu);
    netrec_clear(&n);
    CHECK_OK(fq_engine_set_event_fn(e, NULL, NULL));
    fqt_engine_free(e);
    pthread_mutex_destroy(&log->mu);
    free(log);
    fqt_server_stop(&s);
}

/* Freeing the queue or the engine cancels a search-all and its queued
 * children in one pass: every child still gets its (cancelled) event, once,
 * before the parent's callback. */
TEST(search_all_child_events_when_freed) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    const char *qs[] = {"swift", "c", "go"};
    enum { NQ = 3 };
    for (int free_engine = 0; free_engine <= 1; free_engine++) {
        fq_engine *e = search_engine(&s, NULL);
        fq_queue *q = fqt_queue(e, "q", 1);
        child_log *log = calloc(1, sizeof *log);
        REQUIRE(log != NULL);
        pthread_mutex_init(&log->mu, NULL);
        CHECK_OK(fq_engine_set_event_fn(e, on_child_event, log));
        CHECK_OK(fq_queue_set_suspended(q, true));
        netrec n;
        memset(&n, 0, sizeof n);
        fq_op_id id = search_all(q, qs, NQ, "{\"child_events\": true}", &n);
        REQUIRE(id > 0);
        if (free_engine) {
            fq_engine_free(e);
        } else {
            fq_queue_free(q);
            CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
        }
        CHECK_EQ_INT(atomic_load(&n.r.calls), 1);
        expect(&n, FQ_CANCELLED, FQ_ERR_CANCELLED, free_engine ? "engine freed" : "queue freed");
        pthread_mutex_lock(&log->mu);
        CHECK_EQ_INT(log->n, NQ);
        for (int i = 0; i < log->n; i++) {
            child_ev *c = &log->ev[i];
            CHECK_EQ_INT(c->parent, id);
            CHECK_EQ_INT(c->outcome, FQ_CANCELLED);
            CHECK_EQ_INT(c->status, FQ_ERR_CANCELLED);
            CHECK(strcmp(c->query, qs[0]) == 0 || strcmp(c->query, qs[1]) == 0 || strcmp(c->query, qs[2]) == 0);
            for (int j = 0; j < i; j++)
                if (strcmp(log->ev[j].query, c->query) == 0) FAILF("two child events for %s", c->query);
            if (c->seq >= n.r.done_seq) FAILF("child event %s after the parent's callback", c->query);
            json_decref(c->value);
        }
        pthread_mutex_unlock(&log->mu);
        netrec_clear(&n);
        if (!free_engine) fqt_engine_free(e);
        pthread_mutex_destroy(&log->mu);
        free(log);
    }
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), 0);
    fqt_server_stop(&s);
}
