/* Misuse of the C API: NULL handles and arguments for every function of the
 * header, unknown and finished ids, cancelling twice or too late, freeing a
 * queue or the engine while work is pending or from inside the engine,
 * submitting while the engine is being freed, huge and mistyped values.
 * Every case checks the documented status (and, for a failing call, that
 * fq_last_error() says something), and that nothing crashes, hangs or calls
 * a callback twice or for a rejected submit. What the header calls
 * undefined (a freed handle, an op handle after its operation ended) is not
 * tested. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fqt.h"

/* ------------------------------------------------------------- helpers */

/* `got` must be `want`; a failing status must leave a message. */
static bool expect_status(long long got, long long want, const char *expr, const char *file,
                          int line) {
    if (got != want) {
        h_failf(file, line, "%s = %lld (%s), want %lld (%s) [fq_last_error: %s]", expr, got,
                fq_strerror((int)got), want, fq_strerror((int)want), fq_last_error());
        return false;
    }
    if (want < 0) {
        const char *m = fq_last_error();
        if (!m || !m[0]) {
            h_failf(file, line, "%s failed with %lld but fq_last_error() is empty", expr, got);
            return false;
        }
    }
    return true;
}
#define EXPECT_ST(call, want) expect_status((long long)(call), (long long)(want), #call, __FILE__, __LINE__)

/* A NULL result from a function documented to leave a message. */
static bool expect_null(const void *got, const char *expr, const char *file, int line) {
    if (got != NULL) {
        h_failf(file, line, "%s returned non-NULL, want NULL", expr);
        return false;
    }
    const char *m = fq_last_error();
    if (!m || !m[0]) {
        h_failf(file, line, "%s returned NULL but fq_last_error() is empty", expr);
        return false;
    }
    return true;
}
#define EXPECT_NULL(call) expect_null((call), #call, __FILE__, __LINE__)

/* The last error names `key`. */
#define EXPECT_MSG(key) CHECK_CONTAINS(fq_last_error(), (key))

/* A value to hand to a function that STEALS it: we keep a second reference
 * and check afterwards that the library released its one. */
static json_t *stealable(void) {
    json_t *v = json_object();
    json_incref(v);
    return v;
}
static void check_released(json_t *v, const char *what) {
    if (v->refcount != 1)
        FAILF("%s: the STOLEN value was not released (refcount %zu, want 1)", what, v->refcount);
    json_decref(v);
}

static void check_once(const rec *r, int outcome, int status, const char *what) {
    if (atomic_load(&r->calls) != 1)
        FAILF("%s: %d callbacks, want exactly 1", what, atomic_load(&r->calls));
    if (r->outcome != outcome || r->status != status)
        FAILF("%s: outcome %d status %d (%s), want outcome %d status %d (%s) [%s]", what,
              r->outcome, r->status, fq_strerror(r->status), outcome, status,
              fq_strerror(status), r->error);
}

static void check_never_called(const rec *r, const char *what) {
    if (atomic_load(&r->calls) || atomic_load(&r->body_runs))
        FAILF("%s: a rejected submit ran its body (%d) or callback (%d)", what,
              atomic_load(&r->body_runs), atomic_load(&r->calls));
}

/* A block body that runs until its operation is cancelled, or until
 * *(atomic_int *)r->user is set. */
static json_t *body_until_released(fq_op *op, void *userdata) {
    rec *r = userdata;
    atomic_fetch_add(&r->body_runs, 1);
    atomic_store(&r->op, op);
    long long deadline = fqt_now_ms() + h_scaled_ms(FQT_LONG_MS);
    while (!fq_op_is_cancelled(op) && !(r->user && atomic_load((atomic_int *)r->user)) &&
           fqt_now_ms() < deadline)
        fqt_sleep_ms(1);
    r->tag = fq_op_is_cancelled(op) ? 1 : 2;
    return json_pack("{s:s}", "body", "returned");
}

static json_t *body_fail(fq_op *op, void *userdata) {
    (void)userdata;
    fq_op_set_error(op, "planned failure");
    return NULL;
}

/* ------------------------------------------------- NULL handles everywhere */

static void log_sink(int level, const char *message, void *userdata) {
    (void)level;
    (void)message;
    (void)userdata;
}
static void event_sink(const fq_event *ev, void *userdata) {
    (void)ev;
    (void)userdata;
}

TEST(misuse_null_engine_and_queue_functions) {
    /* functions without handles never fail */
    CHECK(fq_version() == FQ_VERSION_HEX);
    CHECK(fq_version_string() != NULL);
    CHECK(fq_strerror(INT_MIN) != NULL && fq_strerror(INT_MAX) != NULL);
    CHECK(fq_last_error() != NULL);

    CHECK_EQ_INT(fq_engine_free(NULL), FQ_OK);
    EXPECT_ST(fq_engine_wait_idle(NULL, 0), FQ_ERR_INVALID);
    EXPECT_ST(fq_engine_wait_idle(NULL, -1), FQ_ERR_INVALID); /* must not wait forever */
    EXPECT_ST(fq_engine_set_log_fn(NULL, log_sink, NULL), FQ_ERR_INVALID);
    EXPECT_ST(fq_engine_set_log_fn(NULL, NULL, NULL), FQ_ERR_INVALID);
    EXPECT_ST(fq_engine_set_event_fn(NULL, event_sink, NULL), FQ_ERR_INVALID);
    EXPECT_ST(fq_engine_set_event_fn(NULL, NULL, NULL), FQ_ERR_INVALID);
    CHECK(fq_engine_stats(NULL) == NULL);
    CHECK_EQ_INT(fq_engine_event_fd(NULL), -1);
    EXPECT_ST(fq_engine_dispatch(NULL, 0), FQ_ERR_INVALID);
    EXPECT_ST(fq_engine_dispatch(NULL, -1), FQ_ERR_INVALID);

    EXPECT_NULL(fq_queue_new(NULL, "q", 1));
    fq_queue_free(NULL);
    EXPECT_ST(fq_queue_set_max_concurrent(NULL, 1), FQ_ERR_INVALID);
    EXPECT_ST(fq_queue_set_suspended(NULL, true), FQ_ERR_INVALID);
    EXPECT_ST(fq_queue_set_suspended(NULL, false), FQ_ERR_INVALID);
    EXPECT_ST(fq_queue_cancel_all(NULL), FQ_ERR_INVALID);
    EXPECT_ST(fq_queue_wait(NULL, 0), FQ_ERR_INVALID);
    EXPECT_ST(fq_queue_wait(NULL, -1), FQ_ERR_INVALID);

    EXPECT_ST(fq_cancel(NULL, 1), FQ_ERR_INVALID);
    EXPECT_ST(fq_cancel_group(NULL, "g"), FQ_ERR_INVALID);
    EXPECT_ST(fq_cancel_group(NULL, NULL), FQ_ERR_INVALID);
    EXPECT_ST(fq_cancel_all(NULL), FQ_ERR_INVALID);
    EXPECT_ST(fq_set_priority(NULL, 1, 0), FQ_ERR_INVALID);
    EXPECT_ST(fq_add_dependency(NULL, 1, 2), FQ_ERR_INVALID);

    /* a real engine, NULL arguments */
    fq_engine *e = fqt_engine(NULL);
    EXPECT_NULL(fq_queue_new(e, NULL, 1));
    EXPECT_ST(fq_cancel_group(e, NULL), FQ_ERR_INVALID);
    /* clearing functions with NULL is allowed */
    CHECK_OK(fq_engine_set_log_fn(e, NULL, NULL));
    CHECK_OK(fq_engine_set_event_fn(e, NULL, NULL));
    fqt_engine_free(e);

    /* a NULL config means the defaults; a NULL errbuf is allowed */
    e = fq_engine_new(NULL, NULL, 0);
    CHECK(e != NULL);
    CHECK_EQ_INT(fq_engine_free(e), FQ_OK);
}

/* A NULL-terminated-at-once array of queries (the entry is never read). */
static const char *const *none_too(void) {
    static const char *const none[] = {NULL};
    return none;
}

TEST(misuse_null_submit_arguments) {
    fq_engine *e = fqt_engine("{\"search\": {\"url\": \"http://127.0.0.1:9/?q={query}\"}}");
    fq_queue *q = fqt_queue(e, "q", 1);
    json_t *req = fqt_json("{\"url\": \"http://127.0.0.1:9/\"}");
    const char *qs[] = {"a", NULL, "b"};
    rec r = {0};

    EXPECT_ST(fq_submit_block(NULL, body_tag, NULL, rec_done, &r), FQ_ERR_INVALID);
    EXPECT_ST(fq_submit_block(q, NULL, NULL, rec_done, &r), FQ_ERR_INVALID);
    EXPECT_ST(fq_submit_async(NULL, body_async_capture, NULL, rec_done, &r), FQ_ERR_INVALID);
    EXPECT_ST(fq_submit_async(q, NULL, NULL, rec_done, &r), FQ_ERR_INVALID);
    EXPECT_ST(fq_submit_request(NULL, req, NULL, rec_done, &r), FQ_ERR_INVALID);
    EXPECT_ST(fq_submit_request(q, NULL, NULL, rec_done, &r), FQ_ERR_INVALID);
    EXPECT_ST(fq_submit_search(NULL, "q", NULL, rec_done, &r), FQ_ERR_INVALID);
    EXPECT_ST(fq_submit_search(q, NULL, NULL, rec_done, &r), FQ_ERR_INVALID);
    EXPECT_ST(fq_submit_search_all(NULL, qs, 1, NULL, rec_done, &r), FQ_ERR_INVALID);
    EXPECT_ST(fq_submit_search_all(q, NULL, 2, NULL, rec_done, &r), FQ_ERR_INVALID);
    EXPECT_ST(fq_submit_search_all(q, qs, 3, NULL, rec_done, &r), FQ_ERR_INVALID); /* qs[1] NULL */
    EXPECT_ST(fq_submit_search_all(q, qs, 0, NULL, rec_done, &r), FQ_ERR_INVALID);
    /* An n no array can have, whose first entry is NULL: refused at that
     * entry (n = 2^40 aborted the process, n = 2^63 - 1 corrupted the heap:
     * the tenth review) */
    EXPECT_ST(fq_submit_search_all(q, none_too(), (size_t)1 << 63, NULL, rec_done, &r), FQ_ERR_INVALID);
    EXPECT_MSG("n is larger than any array can be");
    const char *none[] = {NULL};
    const size_t huge[] = {(size_t)1 << 40, (size_t)1 << 60, ((size_t)1 << 63) - 1, ((size_t)1 << 60) - 1};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        EXPECT_ST(fq_submit_search_all(q, none, huge[i], NULL, rec_done, &r), FQ_ERR_INVALID);
        EXPECT_MSG("queries[0] is NULL");
        CHECK_EQ_INT((int)fq_submit_requests(q, NULL, none, huge[i], NULL, rec_done, NULL, NULL), FQ_ERR_INVALID);
        EXPECT_MSG("urls[0] is NULL");
    }
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    check_never_called(&r, "NULL submit arguments");
    CHECK_EQ_INT(fqt_stat(e, "submitted", -1), 0);

    /* done == NULL is allowed: the operation runs, nobody is called */
    rec body = {0};
    CHECK(fq_submit_block(q, body_tag, NULL, NULL, &body) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&body.body_runs), 1);
    CHECK_EQ_INT(fqt_stat(e, "succeeded", -1), 1);
    json_decref(req);
    fqt_engine_free(e);
}

TEST(misuse_null_op_result_event_accessors) {
    EXPECT_ST(fq_op_get_id(NULL), FQ_ERR_INVALID);
    CHECK(!fq_op_is_cancelled(NULL));
    EXPECT_ST(fq_op_set_error(NULL, "x"), FQ_ERR_INVALID);
    EXPECT_ST(fq_op_set_error(NULL, NULL), FQ_ERR_INVALID);
    json_t *v = stealable();
    EXPECT_ST(fq_op_finish(NULL, v, NULL), FQ_ERR_INVALID);
    check_released(v, "fq_op_finish(NULL, value, NULL)");
    v = stealable();
    EXPECT_ST(fq_op_finish(NULL, v, "error"), FQ_ERR_INVALID);
    check_released(v, "fq_op_finish(NULL, value, error)");
    EXPECT_ST(fq_op_finish(NULL, NULL, NULL), FQ_ERR_INVALID);
    CHECK(fq_op_dependency_result(NULL, 1) == NULL);
    CHECK(fq_op_dependency(NULL, 1) == NULL);

    CHECK_EQ_INT(fq_result_op_id(NULL), 0);
    CHECK_EQ_INT(fq_result_outcome(NULL), 0);
    CHECK_EQ_INT(fq_result_status(NULL), FQ_ERR_INVALID);
    CHECK(fq_result_error(NULL) == NULL);
    CHECK(fq_result_value(NULL) == NULL);
    CHECK_EQ_INT(fq_result_http_status(NULL), 0);
    CHECK(fq_result_headers(NULL) == NULL);
    size_t len = 77;
    CHECK(fq_result_body(NULL, &len) == NULL);
    CHECK_EQ_INT(len, 0);
    CHECK(fq_result_body(NULL, NULL) == NULL);
    CHECK(fq_result_metrics(NULL) == NULL);
    CHECK(!fq_result_from_cache(NULL));

    CHECK_EQ_INT(fq_event_op_id(NULL), 0);
    CHECK_EQ_INT(fq_event_get_type(NULL), 0);
    uint64_t a = 5, b = 6;
    EXPECT_ST(fq_event_progress(NULL, &a, &b), FQ_ERR_INVALID);
    EXPECT_ST(fq_event_progress(NULL, NULL, NULL), FQ_ERR_INVALID);
    CHECK(fq_event_result(NULL) == NULL);
    CHECK(fq_event_query(NULL) == NULL);
}

/* A store or cache file in a directory the process may not write to: the
 * message says why ("Permission denied"), not SQLite's last attempt's "No
 * such file or directory". Run in a child of its own, which drops root
 * (CI runs as root, for whom permissions do not apply) to the user nobody;
 * its two messages come back through a pipe. */
TEST(misuse_a_file_in_a_directory_not_writable_says_permission_denied) {
    char dir[] = "/tmp/fq-misuse-eacces-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    REQUIRE(chmod(dir, 0555) == 0);
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    fflush(NULL);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        close(fds[0]);
        if (getuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(3);
        char path[128], errbuf[512] = "", out[1200];
        snprintf(path, sizeof path, "%s/store.db", dir);
        fq_store *st = fq_store_open(path, errbuf, sizeof errbuf);
        int stored = fq_last_status();
        char config[256], engine_err[512] = "";
        snprintf(config, sizeof config, "{\"log\": \"off\", \"cache\": {\"path\": \"%s/cache.db\"}}", dir);
        json_t *cfg = json_loads(config, 0, NULL);
        fq_engine *e = fq_engine_new(cfg, engine_err, sizeof engine_err);
        int cached = fq_last_status();
        json_decref(cfg);
        int n = snprintf(out, sizeof out, "%d %d %d %d\n%s\n%s\n", st != NULL, stored, e != NULL, cached,
                         errbuf, engine_err);
        if (write(fds[1], out, (size_t)n) != n) _exit(4);
        _exit(0);
    }
    close(fds[1]);
    char got[1200] = "";
    size_t used = 0;
    ssize_t r;
    while (used < sizeof got - 1 && (r = read(fds[0], got + used, sizeof got - 1 - used)) > 0) used += (size_t)r;
    close(fds[0]);
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK_EQ_INT(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0);
    int opened = -1, stored = -1, made = -1, cached = -1;
    CHECK_EQ_INT(sscanf(got, "%d %d %d %d", &opened, &stored, &made, &cached), 4);
    CHECK_EQ_INT(opened, 0);
    CHECK_EQ_INT(stored, FQ_ERR_STORE);
    CHECK_EQ_INT(made, 0);
    CHECK_EQ_INT(cached, FQ_ERR_STORE);
    char *store_msg = strchr(got, '\n');
    REQUIRE(store_msg != NULL);
    char *cache_msg = strchr(store_msg + 1, '\n');
    REQUIRE(cache_msg != NULL);
    *cache_msg++ = '\0';
    cache_msg[strcspn(cache_msg, "\n")] = '\0';
    CHECK_CONTAINS(store_msg, "store.db");
    CHECK_CONTAINS(store_msg, "Permission denied");
    CHECK_CONTAINS(cache_msg, "cache.db");
    CHECK_CONTAINS(cache_msg, "Permission denied");
    h_note("store: %s", store_msg + 1);
    h_note("cache: %s", cache_msg);
    /* As root too, where access() says yes to every directory: a file
     * system that refuses (sysfs) is named by its reason. Checked where
     * this machine has one (CI and the development machines run as root
     * with sysfs at /sys). */
    char probe[] = "/sys/fq-misuse-probe.db";
    int probe_fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
    int refusal = errno;
    if (probe_fd >= 0) {
        close(probe_fd);
        unlink(probe);
        h_note("/sys takes files here: not checked");
    } else if (refusal == ENOENT) {
        h_note("no /sys here: not checked");
    } else {
        char sys_err[512] = "";
        CHECK(fq_store_open(probe, sys_err, sizeof sys_err) == NULL);
        CHECK_CONTAINS(sys_err, strerror(refusal));
    }
    /* nothing was made there */
    char leftover[160];
    snprintf(leftover, sizeof leftover, "%s/store.db", dir);
    CHECK(access(leftover, F_OK) != 0);
    snprintf(leftover, sizeof leftover, "%s/cache.db", dir);
    CHECK(access(leftover, F_OK) != 0);
    CHECK_EQ_INT(rmdir(dir), 0);
}

/* An item jansson can hold but reading back refuses (a member name with a
 * NUL byte; nesting deeper than jansson's 2048 levels) is refused by
 * fq_store_upsert: accepted, it made its whole collection unreadable. */
/* A path longer than SQLite takes (512 bytes as an absolute path) in a
 * directory that exists: the message says so (it said "No such file or
 * directory" or "Invalid argument": the tenth review). */
TEST(misuse_a_path_longer_than_sqlite_takes_says_so) {
    char dir[] = "/tmp/fq-misuse-long-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    char path[800], part[201];
    memset(part, 'd', 200);
    part[200] = '\0';
    snprintf(path, sizeof path, "%s/%s", dir, part);
    REQUIRE(mkdir(path, 0700) == 0);
    part[0] = 'e';
    size_t used = strlen(path);
    snprintf(path + used, sizeof path - used, "/%s", part);
    REQUIRE(mkdir(path, 0700) == 0);
    used = strlen(path);
    snprintf(path + used, sizeof path - used, "/%.150s.db", part);
    REQUIRE(strlen(path) > 512);
    char errbuf[1024] = "";
    CHECK(fq_store_open(path, errbuf, sizeof errbuf) == NULL);
    CHECK_EQ_INT(fq_last_status(), FQ_ERR_STORE);
    CHECK_CONTAINS(errbuf, "SQLite takes at most 511");
    char config[1200];
    snprintf(config, sizeof config, "{\"log\": \"off\", \"cache\": {\"path\": \"%s\"}}", path);
    json_t *cfg = json_loads(config, 0, NULL);
    REQUIRE(cfg != NULL);
    char engine_err[1024] = "";
    CHECK(fq_engine_new(cfg, engine_err, sizeof engine_err) == NULL);
    json_decref(cfg);
    CHECK_CONTAINS(engine_err, "SQLite takes at most 511");
    CHECK(access(path, F_OK) != 0); /* nothing left there */
    char cmd[900];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK_EQ_INT(system(cmd), 0);
}

/* A store at DIR/store.db in a new directory made from `dir` (a mkdtemp
 * template, at most 63 bytes); remove_dir() removes the directory after. */
static fq_store *temp_store(char *dir) {
    REQUIRE(mkdtemp(dir) != NULL);
    char path[128], errbuf[256] = "";
    snprintf(path, sizeof path, "%s/store.db", dir);
    fq_store *s = fq_store_open(path, errbuf, sizeof errbuf);
    if (!s) FAILF("fq_store_open(%s): %s", path, errbuf);
    REQUIRE(s != NULL);
    return s;
}

static void remove_dir(const char *dir) {
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK_EQ_INT(system(cmd), 0);
}

TEST(misuse_store_upsert_refuses_items_that_would_not_read_back) {
    char dir[] = "/tmp/fq-misuse-readback-XXXXXX";
    fq_store *s = temp_store(dir);
    json_t *nul_key = json_pack("{s:s}", "id", "nul");
    json_object_setn_new(nul_key, "a\0b", 3, json_integer(1));
    json_t *deep = json_array(), *inner = deep;
    for (int i = 0; i < 2100; i++) {
        json_t *next = json_array();
        json_array_append_new(inner, next);
        inner = next;
    }
    json_t *deep_item = json_pack("{s:s, s:o}", "id", "deep", "v", deep);
    json_t *bad[] = {nul_key, deep_item};
    const char *why[] = {"NUL", "depth"};
    for (int b = 0; b < 2; b++) {
        json_t *items = json_pack("[{s:s}, O]", "id", "good", bad[b]);
        json_t *report = NULL;
        EXPECT_ST(fq_store_upsert(s, "c", items, "/id", NULL, &report), FQ_ERR_INVALID);
        EXPECT_MSG("item 1 cannot be stored");
        EXPECT_MSG(why[b]);
        CHECK(report == NULL);
        CHECK_EQ_INT((int)fq_store_count(s, "c"), 0);
        json_decref(items);
    }
    /* the collection stays readable, and a deep but readable item is kept */
    json_t *ok = json_array(), *level = ok;
    for (int i = 0; i < 100; i++) {
        json_t *next = json_array();
        json_array_append_new(level, next);
        level = next;
    }
    json_t *items = json_pack("[{s:s}, {s:s, s:o}]", "id", "good", "id", "deep100", "v", ok);
    CHECK_OK(fq_store_upsert(s, "c", items, "/id", NULL, NULL));
    json_t *all = fq_store_items(s, "c", NULL, false);
    CHECK(json_is_array(all) && json_array_size(all) == 2);
    json_t *back = NULL;
    CHECK_OK(fq_store_get(s, "c", "deep100", &back));
    CHECK(json_equal(back, json_array_get(items, 1)));
    json_decref(back);
    json_decref(all);
    json_decref(items);
    json_decref(nul_key);
    json_decref(deep_item);
    fq_store_free(s);
    remove_dir(dir);
}

TEST(misuse_null_store_arguments) {
    char errbuf[256] = "";
    CHECK(fq_store_open(NULL, errbuf, sizeof errbuf) == NULL);
    CHECK(errbuf[0] != '\0');
    CHECK(fq_last_error()[0] != '\0');
    errbuf[0] = '\0';
    CHECK(fq_store_open("/nonexistent-fetchq-dir/x/store.db", errbuf, sizeof errbuf) == NULL);
    CHECK(errbuf[0] != '\0');
    fq_store_free(NULL);

    char dir[] = "/tmp/fq-misuse-store-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/store.db", dir);
    fq_store *s = fq_store_open(path, errbuf, sizeof errbuf);
    if (!s) FAILF("fq_store_open(%s): %s", path, errbuf);
    REQUIRE(s != NULL);
    json_t *items = fqt_json("[{\"id\": \"1\", \"v\": \"a\"}, {\"id\": \"2\"}]");
    json_t *item = (json_t *)&item; /* a sentinel: must not be used as a result */

    EXPECT_NULL(fq_store_items(NULL, "c", NULL, false));
    EXPECT_NULL(fq_store_items(s, NULL, NULL, false));
    EXPECT_NULL(fq_store_items(s, "c", "not-a-pointer", false));
    EXPECT_ST(fq_store_get(NULL, "c", "1", &item), FQ_ERR_INVALID);
    EXPECT_ST(fq_store_get(s, NULL, "1", &item), FQ_ERR_INVALID);
    EXPECT_ST(fq_store_get(s, "c", NULL, &item), FQ_ERR_INVALID);
    EXPECT_ST(fq_store_get(s, "c", "1", NULL), FQ_ERR_INVALID);
    EXPECT_ST(fq_store_count(NULL, "c"), FQ_ERR_INVALID);
    EXPECT_ST(fq_store_count(s, NULL), FQ_ERR_INVALID);
    json_t *report = NULL;
    EXPECT_ST(fq_store_upsert(NULL, "c", items, "/id", NULL, &report), FQ_ERR_INVALID);
    EXPECT_ST(fq_store_upsert(s, NULL, items, "/id", NULL, &report), FQ_ERR_INVALID);
    EXPECT_ST(fq_store_upsert(s, "c", NULL, "/id", NULL, &report), FQ_ERR_INVALID);
    EXPECT_ST(fq_store_upsert(s, "c", items, NULL, NULL, &report), FQ_ERR_INVALID);
    /* not an array, an element that is not an object, a bad pointer, a bad
     * merge: all or nothing, nothing written */
    json_t *obj = fqt_json("{\"id\": 1}");
    EXPECT_ST(fq_store_upsert(s, "c", obj, "/id", NULL, &report), FQ_ERR_INVALID);
    json_t *mixed = fqt_json("[{\"id\": 1}, 5, \"x\"]");
    EXPECT_ST(fq_store_upsert(s, "c", mixed, "/id", NULL, &report), FQ_ERR_INVALID);
    EXPECT_ST(fq_store_upsert(s, "c", items, "id", NULL, &report), FQ_ERR_INVALID);
    EXPECT_ST(fq_store_upsert(s, "c", items, "/id", "bogus", &report), FQ_ERR_INVALID);
    EXPECT_MSG("bogus");
    CHECK(report == NULL);
    CHECK_EQ_INT(fq_store_count(s, "c"), 0);
    /* and the store still works */
    CHECK_OK(fq_store_upsert(s, "c", items, "/id", NULL, &report));
    CHECK_EQ_INT(fqt_int(report, "inserted", -1), 2);
    json_decref(report);
    CHECK_EQ_INT(fq_store_count(s, "c"), 2);
    item = NULL;
    CHECK_OK(fq_store_get(s, "c", "1", &item));
    CHECK(json_is_object(item));
    json_decref(item);
    fq_store_free(s);
    json_decref(items);
    json_decref(obj);
    json_decref(mixed);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* fq_store_get_json: `id` is BORROWED (the caller's reference is left as it
 * was, also when nothing is found or the call fails), *item a NEW reference;
 * ids of other types than strings are found by their JSON value ("1" and 1
 * are two ids). No other test called it. */
TEST(misuse_store_get_json_borrows_the_id) {
    char dir[] = "/tmp/fq-misuse-getjson-XXXXXX";
    fq_store *s = temp_store(dir);
    json_t *items = fqt_json("[{\"id\": 1, \"v\": \"number\"}, {\"id\": \"1\", \"v\": \"string\"}]");
    CHECK_OK(fq_store_upsert(s, "c", items, "/id", NULL, NULL));
    /* a second reference of our own, so that a wrongly stolen one shows as
     * a count of 1 instead of freeing the value */
    json_t *id = json_incref(json_integer(1)), *missing = json_incref(json_integer(2));
    json_t *item = NULL;
    CHECK_OK(fq_store_get_json(s, "c", id, &item));
    CHECK_EQ_INT(id->refcount, 2); /* BORROWED: not stolen */
    REQUIRE(json_is_object(item));
    CHECK_STR(json_string_value(json_object_get(item, "v")), "number");
    CHECK_EQ_INT(item->refcount, 1); /* NEW: ours alone */
    json_decref(item);
    item = (json_t *)&item; /* a sentinel */
    CHECK_OK(fq_store_get_json(s, "c", missing, &item));
    CHECK(item == NULL);
    CHECK_EQ_INT(missing->refcount, 2);
    item = (json_t *)&item;
    EXPECT_ST(fq_store_get_json(s, NULL, id, &item), FQ_ERR_INVALID);
    CHECK(item == NULL);
    EXPECT_ST(fq_store_get_json(s, "c\xfe", id, &item), FQ_ERR_INVALID);
    CHECK_EQ_INT(id->refcount, 2);
    if (id->refcount == 2) json_decref(id);
    if (missing->refcount == 2) json_decref(missing);
    json_decref(id);
    json_decref(missing);
    json_decref(items);
    fq_store_free(s);
    remove_dir(dir);
}

/* Strings that are not UTF-8 are refused, not repaired into U+FFFD (which
 * would make "\xff" and "\xfe" the same query, collection or id). */
TEST(misuse_strings_that_are_not_utf8) {
    fq_engine *e = fqt_engine("{\"search\": {\"url\": \"http://127.0.0.1:9/?q={query}\"}}");
    REQUIRE(fq_queue_new(e, "bad\xff", 1) == NULL);
    EXPECT_MSG("not valid UTF-8");
    fq_queue *q = fqt_queue(e, "q", 1);
    CHECK_OK(fq_queue_set_suspended(q, true));
    rec r = {0};
    EXPECT_ST(fq_submit_search(q, "\xff\xfe" "ab", NULL, rec_done, &r), FQ_ERR_INVALID);
    EXPECT_MSG("the query is not valid UTF-8");
    const char *qs[] = {"ok", "\xff"};
    EXPECT_ST(fq_submit_search_all(q, qs, 2, NULL, rec_done, &r), FQ_ERR_INVALID);
    EXPECT_MSG("queries[1] is not valid UTF-8");
    const char *urls[] = {"http://127.0.0.1:9/\xe9"};
    EXPECT_ST(fq_submit_requests(q, NULL, urls, 1, NULL, rec_done, NULL, NULL), FQ_ERR_INVALID);
    EXPECT_MSG("urls[0] is not valid UTF-8");
    EXPECT_ST(fq_cancel_group(e, "g\xc3"), FQ_ERR_INVALID);
    CHECK_EQ_INT(fqt_stat(e, "submitted", -1), 0);
    check_never_called(&r, "submits with strings that are not UTF-8");

    char dir[] = "/tmp/fq-misuse-utf8-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    char path[128], badpath[128];
    snprintf(path, sizeof path, "%s/store.db", dir);
    snprintf(badpath, sizeof badpath, "%s/st\xf6re.db", dir);
    char errbuf[256] = "";
    CHECK(fq_store_open(badpath, errbuf, sizeof errbuf) == NULL);
    CHECK_CONTAINS(errbuf, "not valid UTF-8");
    fq_store *s = fq_store_open(path, errbuf, sizeof errbuf);
    REQUIRE(s != NULL);
    json_t *items = fqt_json("[{\"id\": \"\\ufffd\", \"v\": 1}]");
    json_t *report = NULL, *item = NULL;
    EXPECT_ST(fq_store_upsert(s, "c\xff", items, "/id", NULL, &report), FQ_ERR_INVALID);
    EXPECT_ST(fq_store_upsert(s, "c", items, "/i\xff" "d", NULL, &report), FQ_ERR_INVALID);
    EXPECT_ST(fq_store_upsert(s, "c", items, "/id", "overwrite\xff", &report), FQ_ERR_INVALID);
    CHECK(report == NULL);
    CHECK_OK(fq_store_upsert(s, "c", items, "/id", NULL, &report));
    json_decref(report);
    /* the stored id is U+FFFD itself: an invalid byte does not find it */
    EXPECT_ST(fq_store_get(s, "c", "\x80", &item), FQ_ERR_INVALID);
    CHECK(item == NULL);
    CHECK_OK(fq_store_get(s, "c", "\xef\xbf\xbd", &item));
    CHECK(json_is_object(item));
    json_decref(item);
    EXPECT_ST(fq_store_count(s, "c\xfe"), FQ_ERR_INVALID);
    EXPECT_NULL(fq_store_items(s, "c\xfe", NULL, false));
    EXPECT_NULL(fq_store_items(s, "c", "/\xfe", false));
    CHECK_EQ_INT(fq_store_count(s, "c"), 1);
    fq_store_free(s);
    json_decref(items);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    fqt_engine_free(e);
}

/* When the system refuses a thread (here: too little address space for
 * another thread's stack), fq_engine_new returns NULL with a message; it
 * used to stop the process (SIGILL). What was started is stopped, and an
 * engine can be made again once there is room. It cannot run under ASan,
 * whose shadow memory needs far more address space than the limit set here:
 * tools/check-sanitizers.sh leaves it out there (ASAN_SKIP) and says so. */
TEST(misuse_engine_new_when_no_thread_can_start) {
#if defined(__SANITIZE_ADDRESS__)
    FAILF("cannot run under ASan (RLIMIT_AS would stop ASan itself): leave it out");
#else
    struct rlimit old;
    REQUIRE(getrlimit(RLIMIT_AS, &old) == 0);
    long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    REQUIRE(f != NULL && fscanf(f, "%ld", &pages) == 1);
    fclose(f);
    struct rlimit low = old;
    low.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)96 << 20);
    REQUIRE(setrlimit(RLIMIT_AS, &low) == 0);
    fq_engine *engines[64];
    int made = 0;
    char err[256] = "";
    while (made < 64) {
        fq_engine *e = fq_engine_new(NULL, err, sizeof err);
        if (!e) break;
        engines[made++] = e;
    }
    REQUIRE(setrlimit(RLIMIT_AS, &old) == 0);
    h_note("%d engines made within the limit", made);
    CHECK(made < 64);
    CHECK_CONTAINS(err, "pthread_create failed");
    CHECK_CONTAINS(fq_last_error(), "pthread_create failed");
    CHECK_EQ_INT(fq_last_status(), FQ_ERR_NOMEM);
    for (int i = 0; i < made; i++) CHECK_OK(fq_engine_free(engines[i]));
    fq_engine *again = fq_engine_new(NULL, err, sizeof err);
    REQUIRE(again != NULL);
    fq_queue *q = fq_queue_new(again, "q", 1);
    rec r = {0};
    CHECK(fq_submit_block(q, body_tag, NULL, rec_done, &r) > 0);
    CHECK_OK(fq_engine_wait_idle(again, FQT_LONG_MS));
    CHECK_EQ_INT(r.outcome, FQ_SUCCEEDED);
    rec_clear(&r);
    CHECK_OK(fq_engine_free(again));
#endif
}

/* ----------------------------------------------- unknown and finished ids */

TEST(misuse_unknown_and_finished_ids) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    fq_queue *paused = fqt_queue(e, "paused", 1);
    CHECK_OK(fq_queue_set_suspended(paused, true));

    /* ids that never existed: 0, negative, huge */
    const fq_op_id never[] = {987654321, 0, -1, -987654321, INT64_MAX, INT64_MIN};
    for (size_t i = 0; i < sizeof never / sizeof *never; i++) {
        EXPECT_ST(fq_cancel(e, never[i]), FQ_ERR_NOT_FOUND);
        EXPECT_ST(fq_set_priority(e, never[i], 4), FQ_ERR_NOT_FOUND);
        EXPECT_ST(fq_add_dependency(e, never[i], never[i]), FQ_ERR_NOT_FOUND);
    }

    /* a finished (succeeded) operation */
    rec done = {0};
    fq_op_id fin = fqt_block(q, body_tag, NULL, rec_done, &done);
    REQUIRE(fin > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    check_once(&done, FQ_SUCCEEDED, FQ_OK, "finished op");
    EXPECT_ST(fq_cancel(e, fin), FQ_ERR_NOT_FOUND);
    EXPECT_ST(fq_set_priority(e, fin, 4), FQ_ERR_NOT_FOUND);

    /* a pending one, and add_dependency around it */
    rec pend = {0};
    fq_op_id p = fqt_block(paused, body_tag, NULL, rec_done, &pend);
    REQUIRE(p > 0);
    EXPECT_ST(fq_add_dependency(e, fin, p), FQ_ERR_NOT_FOUND); /* op finished */
    EXPECT_ST(fq_add_dependency(e, p, 987654321), FQ_ERR_NOT_FOUND);
    EXPECT_ST(fq_add_dependency(e, p, p), FQ_ERR_CYCLE);
    CHECK_OK(fq_add_dependency(e, p, fin)); /* finished and succeeded: as in depends_on */
    EXPECT_ST(fq_set_priority(e, p, 3), FQ_ERR_INVALID);
    EXPECT_ST(fq_set_priority(e, p, INT_MAX), FQ_ERR_INVALID);
    EXPECT_ST(fq_set_priority(e, p, INT_MIN), FQ_ERR_INVALID);
    CHECK_OK(fq_set_priority(e, p, 8));
    rec pend2 = {0};
    fq_op_id p2 = fqt_block(paused, body_tag, NULL, rec_done, &pend2);
    REQUIRE(p2 > 0);
    CHECK_OK(fq_add_dependency(e, p2, p));
    EXPECT_ST(fq_add_dependency(e, p, p2), FQ_ERR_CYCLE);

    /* a running one */
    atomic_int release = 0;
    rec run = {0};
    run.user = &release;
    fq_op_id r = fqt_block(q, body_until_released, NULL, rec_done, &run);
    REQUIRE(r > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&run.body_runs) == 1, FQT_LONG_MS));
    EXPECT_ST(fq_set_priority(e, r, 4), FQ_ERR_STATE);
    EXPECT_ST(fq_add_dependency(e, r, p), FQ_ERR_STATE);
    atomic_store(&release, 1);

    CHECK_OK(fq_queue_set_suspended(paused, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    check_once(&pend, FQ_SUCCEEDED, FQ_OK, "pending op after the misuse");
    check_once(&pend2, FQ_SUCCEEDED, FQ_OK, "its dependent");
    CHECK(pend2.start_seq > pend.end_seq);
    check_once(&run, FQ_SUCCEEDED, FQ_OK, "running op after the misuse");
    CHECK_EQ_INT(run.tag, 2);
    rec_clear(&done);
    rec_clear(&pend);
    rec_clear(&pend2);
    rec_clear(&run);
    fqt_engine_free(e);
}

/* ------------------------------------------------------------- cancel */

TEST(misuse_double_cancel_and_cancel_after_completion) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    fq_queue *paused = fqt_queue(e, "paused", 1);
    CHECK_OK(fq_queue_set_suspended(paused, true));

    /* pending: cancel, cancel again, cancel after its callback */
    rec p = {0};
    fq_op_id pid = fqt_block(paused, body_tag, NULL, rec_done, &p);
    REQUIRE(pid > 0);
    CHECK_OK(fq_cancel(e, pid));
    CHECK_OK(fq_cancel(e, pid));
    CHECK(WAIT_UNTIL(atomic_load(&p.calls) == 1, FQT_LONG_MS));
    CHECK_OK(fq_cancel(e, pid)); /* already cancelled, still remembered */
    /* running block: cancel twice */
    rec b = {0};
    fq_op_id bid = fqt_block(q, body_until_released, NULL, rec_done, &b);
    REQUIRE(bid > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&b.body_runs) == 1, FQT_LONG_MS));
    CHECK_OK(fq_cancel(e, bid));
    CHECK_OK(fq_cancel(e, bid));
    /* running async: cancel twice, then finish (FQ_OK: it still has to end) */
    rec a = {0};
    fq_op_id aid = fqt_async(q, body_async_capture, NULL, rec_done, &a);
    REQUIRE(aid > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&a.op) != NULL, FQT_LONG_MS));
    CHECK_OK(fq_cancel(e, aid));
    CHECK_OK(fq_cancel(e, aid));
    CHECK(fq_op_is_cancelled(atomic_load(&a.op)));
    CHECK_EQ_INT(fqt_finish_in_thread(atomic_load(&a.op), json_string("late"), NULL), FQ_OK);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_OK(fq_cancel(e, bid));
    CHECK_OK(fq_cancel(e, aid));
    check_once(&p, FQ_CANCELLED, FQ_ERR_CANCELLED, "pending op cancelled three times");
    check_once(&b, FQ_CANCELLED, FQ_ERR_CANCELLED, "running block cancelled twice");
    check_once(&a, FQ_CANCELLED, FQ_ERR_CANCELLED, "running async cancelled twice");
    CHECK_EQ_INT(atomic_load(&p.body_runs), 0);
    CHECK(a.value == NULL && b.value == NULL);

    /* a succeeded operation is not found; group, queue and engine cancels
     * find nothing */
    rec s = {0};
    fq_op_id sid = fqt_block(q, body_tag, "{\"group\": \"g\"}", rec_done, &s);
    REQUIRE(sid > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    EXPECT_ST(fq_cancel(e, sid), FQ_ERR_NOT_FOUND);
    CHECK_EQ_INT(fq_cancel_group(e, "g"), 0);
    CHECK_EQ_INT(fq_queue_cancel_all(q), 0);
    CHECK_EQ_INT(fq_cancel_all(e), 0);
    check_once(&s, FQ_SUCCEEDED, FQ_OK, "succeeded op");

    /* group, queue and engine cancels twice: the second finds nothing */
    rec g[6];
    memset(g, 0, sizeof g);
    for (int i = 0; i < 6; i++)
        REQUIRE(fqt_block(paused, body_tag, i < 3 ? "{\"group\": \"twice\"}" : NULL, rec_done,
                          &g[i]) > 0);
    CHECK_EQ_INT(fq_cancel_group(e, "twice"), 3);
    CHECK_EQ_INT(fq_cancel_group(e, "twice"), 0);
    rec g2 = {0};
    REQUIRE(fqt_block(paused, body_tag, NULL, rec_done, &g2) > 0);
    CHECK_EQ_INT(fq_queue_cancel_all(paused), 4);
    CHECK_EQ_INT(fq_queue_cancel_all(paused), 0);
    CHECK_EQ_INT(fq_cancel_all(e), 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < 6; i++) check_once(&g[i], FQ_CANCELLED, FQ_ERR_CANCELLED, "group/queue cancelled op");
    check_once(&g2, FQ_CANCELLED, FQ_ERR_CANCELLED, "queue cancelled op");
    rec_clear_all(g, 6);
    rec_clear(&g2);
    rec_clear(&p);
    rec_clear(&b);
    rec_clear(&a);
    rec_clear(&s);
    fqt_engine_free(e);

    /* with "history": 0 nothing finished is remembered: NOT_FOUND */
    e = fqt_engine("{\"history\": 0}");
    paused = fqt_queue(e, "paused", 1);
    CHECK_OK(fq_queue_set_suspended(paused, true));
    rec h = {0};
    fq_op_id hid = fqt_block(paused, body_tag, NULL, rec_done, &h);
    REQUIRE(hid > 0);
    CHECK_OK(fq_cancel(e, hid));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    EXPECT_ST(fq_cancel(e, hid), FQ_ERR_NOT_FOUND);
    check_once(&h, FQ_CANCELLED, FQ_ERR_CANCELLED, "cancelled op, history 0");
    fqt_engine_free(e);
}

/* ------------------------------------------------------------- queue free */

typedef struct {
    rec run_block, run_async, pend_block[3], pend_async[2], dependent, other;
    atomic_int release;
} qfree_case;

static void queue_free_with_pending(bool poll_mode) {
    fq_engine *e = fqt_engine(poll_mode ? "{\"delivery\": \"poll\"}" : NULL);
    fq_queue *q = fqt_queue(e, "doomed", 2);
    fq_queue *other = fqt_queue(e, "other", 1);
    qfree_case c;
    memset(&c, 0, sizeof c);
    c.run_block.user = &c.release;
    REQUIRE(fqt_block(q, body_until_released, NULL, rec_done, &c.run_block) > 0);
    REQUIRE(fqt_async(q, body_async_capture, NULL, rec_done, &c.run_async) > 0);
    REQUIRE(WAIT_UNTIL(atomic_load(&c.run_block.body_runs) == 1 && atomic_load(&c.run_async.op),
                       FQT_LONG_MS));
    /* the queue is full: these wait */
    fq_op_id first = 0;
    for (int i = 0; i < 3; i++) {
        fq_op_id id = fqt_block(q, body_tag, i == 1 ? "{\"priority\": 8}" : NULL, rec_done,
                                &c.pend_block[i]);
        REQUIRE(id > 0);
        if (i == 0) first = id;
    }
    for (int i = 0; i < 2; i++)
        REQUIRE(fqt_async(q, body_async_capture, NULL, rec_done, &c.pend_async[i]) > 0);
    char opts[64];
    snprintf(opts, sizeof opts, "{\"depends_on\": [%lld]}", (long long)first);
    REQUIRE(fqt_block(other, body_tag, opts, rec_done, &c.dependent) > 0);

    fq_queue_free(q); /* returns at once: the running ones go on (they wait for this test) */
    CHECK(!fq_op_is_cancelled(atomic_load(&c.run_async.op)));
    CHECK_EQ_INT(atomic_load(&c.run_block.body_runs), 1);
    CHECK_EQ_INT(atomic_load(&c.run_block.calls), 0);
    CHECK_EQ_INT(atomic_load(&c.run_async.calls), 0);

    /* the other queue still works */
    REQUIRE(fqt_block(other, body_tag, NULL, rec_done, &c.other) > 0);
    atomic_store(&c.release, 1);
    CHECK_EQ_INT(fqt_finish_in_thread(atomic_load(&c.run_async.op), json_integer(7), NULL), FQ_OK);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));

    check_once(&c.run_block, FQ_SUCCEEDED, FQ_OK, "block running when its queue was freed");
    CHECK_EQ_INT(c.run_block.tag, 2); /* it was not cancelled */
    check_once(&c.run_async, FQ_SUCCEEDED, FQ_OK, "async running when its queue was freed");
    CHECK_EQ_INT(json_integer_value(c.run_async.value), 7);
    for (int i = 0; i < 3; i++) {
        check_once(&c.pend_block[i], FQ_CANCELLED, FQ_ERR_CANCELLED, "pending block of a freed queue");
        CHECK_EQ_INT(atomic_load(&c.pend_block[i].body_runs), 0);
    }
    for (int i = 0; i < 2; i++) {
        check_once(&c.pend_async[i], FQ_CANCELLED, FQ_ERR_CANCELLED, "pending async of a freed queue");
        CHECK_EQ_INT(atomic_load(&c.pend_async[i].body_runs), 0);
    }
    check_once(&c.dependent, FQ_CANCELLED, FQ_ERR_DEPENDENCY, "dependent in another queue");
    CHECK(fqt_names_id(c.dependent.error, first));
    check_once(&c.other, FQ_SUCCEEDED, FQ_OK, "op of the other queue");
    if (poll_mode) {
        CHECK(pthread_equal(c.pend_block[0].thread, pthread_self()));
        CHECK(pthread_equal(c.run_block.thread, pthread_self()));
    }
    json_t *st = fq_engine_stats(e);
    CHECK_EQ_INT(fqt_int(st, "submitted", -1), 9);
    CHECK_EQ_INT(fqt_int(st, "succeeded", -1), 3);
    CHECK_EQ_INT(fqt_int(st, "cancelled", -1), 6);
    CHECK_EQ_INT(fqt_int(st, "queued", -1), 0);
    CHECK_EQ_INT(fqt_int(st, "running", -1), 0);
    CHECK_EQ_INT(fqt_int(st, "undelivered", -1), 0);
    json_decref(st);
    rec *all[] = {&c.run_block, &c.run_async, &c.pend_block[0], &c.pend_block[1],
                  &c.pend_block[2], &c.pend_async[0], &c.pend_async[1], &c.dependent, &c.other};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) rec_clear(all[i]);
    fqt_engine_free(e);
}

TEST(misuse_queue_free_with_pending_work) {
    queue_free_with_pending(false);
}

TEST(misuse_queue_free_with_pending_work_poll_mode) {
    queue_free_with_pending(true);
}

typedef struct {
    rec self;
    fq_queue *victim;
} free_queue_cb;

static void free_queue_in_callback(const fq_result *res, void *userdata) {
    free_queue_cb *f = userdata;
    rec_done(res, &f->self);
    fq_queue_free(f->victim);
}

TEST(misuse_queue_free_from_a_callback) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    fq_queue *victim = fqt_queue(e, "victim", 1);
    CHECK_OK(fq_queue_set_suspended(victim, true));
    rec v[4];
    memset(v, 0, sizeof v);
    for (int i = 0; i < 4; i++) REQUIRE(fqt_block(victim, body_tag, NULL, rec_done, &v[i]) > 0);
    free_queue_cb f;
    memset(&f, 0, sizeof f);
    f.victim = victim;
    REQUIRE(fqt_block(q, body_tag, NULL, free_queue_in_callback, &f) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    check_once(&f.self, FQ_SUCCEEDED, FQ_OK, "callback that frees a queue");
    for (int i = 0; i < 4; i++) check_once(&v[i], FQ_CANCELLED, FQ_ERR_CANCELLED, "op of a queue freed by a callback");

    /* a callback freeing its own queue, with more work pending in it. The
     * queue is suspended while we submit: once it is resumed the callback
     * may free it at any time, so this thread must not touch it again. */
    fq_queue *own = fqt_queue(e, "own", 1);
    CHECK_OK(fq_queue_set_suspended(own, true));
    free_queue_cb g;
    memset(&g, 0, sizeof g);
    g.victim = own;
    REQUIRE(fqt_block(own, body_tag, NULL, free_queue_in_callback, &g) > 0);
    rec later[3];
    memset(later, 0, sizeof later);
    for (int i = 0; i < 3; i++) REQUIRE(fqt_block(own, body_tag, NULL, rec_done, &later[i]) > 0);
    CHECK_OK(fq_queue_set_suspended(own, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&g.self.calls), 1);
    for (int i = 0; i < 3; i++) {
        if (atomic_load(&later[i].calls) != 1)
            FAILF("op %d of a queue freed by its own callback: %d callbacks", i,
                  atomic_load(&later[i].calls));
        if (later[i].outcome == FQ_CANCELLED) {
            CHECK_EQ_INT(later[i].status, FQ_ERR_CANCELLED);
            CHECK_EQ_INT(atomic_load(&later[i].body_runs), 0);
        } else {
            CHECK_EQ_INT(later[i].outcome, FQ_SUCCEEDED); /* was running: finishes normally */
        }
    }
    rec_clear_all(v, 4);
    rec_clear_all(later, 3);
    rec_clear(&f.self);
    rec_clear(&g.self);
    fqt_engine_free(e);
}

/* ------------------------------------------------- engine free from inside */

typedef struct {
    fq_engine *e;
    atomic_int rc_callback, rc_block, rc_async, rc_wait_block, rc_other;
    fq_engine *other; /* freed from this engine's callback */
} inside;

static void free_from_callback(const fq_result *res, void *userdata) {
    (void)res;
    inside *x = userdata;
    atomic_store(&x->rc_callback, fq_engine_free(x->e));
}
typedef struct {
    rec r; /* first: rec_done sees the userdata as a rec */
    inside *x;
} inside_rec;

static json_t *free_from_block(fq_op *op, void *userdata) {
    (void)op;
    inside *x = ((inside_rec *)userdata)->x;
    atomic_store(&x->rc_block, fq_engine_free(x->e));
    atomic_store(&x->rc_wait_block, fq_engine_wait_idle(x->e, 10));
    return json_integer(1);
}
static void free_from_async(fq_op *op, void *userdata) {
    inside *x = userdata;
    atomic_store(&x->rc_async, fq_engine_free(x->e));
    fq_op_finish(op, json_integer(2), NULL);
}
static void free_other_engine(const fq_result *res, void *userdata) {
    (void)res;
    inside *x = userdata;
    atomic_store(&x->rc_other, fq_engine_free(x->other));
}

static void engine_free_inside(const char *config) {
    inside x;
    memset(&x, 0, sizeof x);
    atomic_store(&x.rc_callback, 12345);
    atomic_store(&x.rc_block, 12345);
    atomic_store(&x.rc_async, 12345);
    atomic_store(&x.rc_other, 12345);
    x.e = fqt_engine(config);
    fq_queue *q = fqt_queue(x.e, "q", 2);
    inside_rec b;
    memset(&b, 0, sizeof b);
    b.x = &x;
    REQUIRE(fq_submit_block(q, body_noop, NULL, free_from_callback, &x) > 0);
    REQUIRE(fq_submit_block(q, free_from_block, NULL, rec_done, &b) > 0);
    REQUIRE(fq_submit_async(q, free_from_async, NULL, NULL, &x) > 0);
    CHECK_OK(fq_engine_wait_idle(x.e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&x.rc_callback), FQ_ERR_STATE);
    CHECK_EQ_INT(atomic_load(&x.rc_block), FQ_ERR_STATE);
    CHECK_EQ_INT(atomic_load(&x.rc_async), FQ_ERR_STATE);
    CHECK_EQ_INT(atomic_load(&x.rc_wait_block), FQ_ERR_STATE);
    check_once(&b.r, FQ_SUCCEEDED, FQ_OK, "block that tried to free its engine");
    CHECK_EQ_INT(json_integer_value(b.r.value), 1);
    CHECK_EQ_INT(fqt_stat(x.e, "succeeded", -1), 3);

    /* the engine still works */
    rec after = {0};
    REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &after) > 0);
    CHECK_OK(fq_engine_wait_idle(x.e, FQT_LONG_MS));
    check_once(&after, FQ_SUCCEEDED, FQ_OK, "op after the refused frees");

    /* freeing ANOTHER engine from a callback is allowed; its pending work is
     * delivered before fq_engine_free returns */
    x.other = fqt_engine(NULL);
    fq_queue *oq = fqt_queue(x.other, "oq", 1);
    CHECK_OK(fq_queue_set_suspended(oq, true));
    rec op_of_other = {0};
    REQUIRE(fqt_block(oq, body_tag, NULL, rec_done, &op_of_other) > 0);
    REQUIRE(fq_submit_block(q, body_noop, NULL, free_other_engine, &x) > 0);
    CHECK_OK(fq_engine_wait_idle(x.e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&x.rc_other), FQ_OK);
    check_once(&op_of_other, FQ_CANCELLED, FQ_ERR_CANCELLED, "pending op of the other engine");
    rec_clear(&b.r);
    rec_clear(&after);
    rec_clear(&op_of_other);
    fqt_engine_free(x.e);
}

TEST(misuse_engine_free_from_callback_and_bodies) {
    engine_free_inside(NULL);
}

TEST(misuse_engine_free_from_callback_and_bodies_poll_mode) {
    engine_free_inside("{\"delivery\": \"poll\"}");
}

/* ------------------------------------------- submits while the engine frees */

enum { SUBMIT_KINDS = 5 }; /* block, async, request, search-all, many requests */

typedef struct {
    fq_engine *e;
    fq_queue *q;
    atomic_int shutdown_rcs, other_rcs, attempts;
    atomic_int queue_new_null;
    atomic_int body_started;
    rec rejected[SUBMIT_KINDS];
    rec self;
} during_free;

static void submit_everything(during_free *d) {
    json_t *req = json_pack("{s:s}", "url", "http://127.0.0.1:9/");
    const char *qs[] = {"a", "b"};
    const char *urls[] = {"http://127.0.0.1:9/a", "http://127.0.0.1:9/b"};
    void *uds[] = {&d->rejected[4], &d->rejected[4]};
    fq_op_id ids[SUBMIT_KINDS] = {
        fq_submit_block(d->q, body_tag, NULL, rec_done, &d->rejected[0]),
        fq_submit_async(d->q, body_async_capture, NULL, rec_done, &d->rejected[1]),
        fq_submit_request(d->q, req, NULL, rec_done, &d->rejected[2]),
        fq_submit_search_all(d->q, qs, 2, NULL, rec_done, &d->rejected[3]),
        fq_submit_requests(d->q, NULL, urls, 2, NULL, rec_done, uds, NULL),
    };
    json_decref(req);
    for (int i = 0; i < SUBMIT_KINDS; i++) {
        atomic_fetch_add(&d->attempts, 1);
        if (ids[i] == FQ_ERR_SHUTDOWN)
            atomic_fetch_add(&d->shutdown_rcs, 1);
        else {
            atomic_fetch_add(&d->other_rcs, 1);
            FAILF("submit %d while the engine is being freed returned %lld, want FQ_ERR_SHUTDOWN",
                  i, (long long)ids[i]);
        }
    }
    fq_queue *nq = fq_queue_new(d->e, "late", 1);
    if (nq == NULL) atomic_store(&d->queue_new_null, 1);
}

static void submit_in_callback_during_free(const fq_result *res, void *userdata) {
    during_free *d = userdata;
    rec_done(res, &d->self);
    submit_everything(d);
}

static json_t *submit_in_body_during_free(fq_op *op, void *userdata) {
    during_free *d = userdata;
    atomic_store(&d->body_started, 1);
    long long deadline = fqt_now_ms() + h_scaled_ms(FQT_LONG_MS);
    while (!fq_op_is_cancelled(op) && fqt_now_ms() < deadline) fqt_sleep_ms(1);
    submit_everything(d);
    return NULL;
}

static void submit_during_free(const char *config) {
    during_free cb, body;
    memset(&cb, 0, sizeof cb);
    memset(&body, 0, sizeof body);
    /* every submit below would be valid: only the shutdown rejects it */
    char cfg[256];
    snprintf(cfg, sizeof cfg,
             "{%s \"search\": {\"url\": \"http://127.0.0.1:9/?q={query}\"}}",
             config ? "\"delivery\": \"poll\"," : "");
    fq_engine *e = fqt_engine(cfg);
    fq_queue *q = fqt_queue(e, "q", 1);
    fq_queue *paused = fqt_queue(e, "paused", 1);
    CHECK_OK(fq_queue_set_suspended(paused, true));
    cb.e = body.e = e;
    cb.q = body.q = q;
    REQUIRE(fq_submit_block(paused, body_noop, NULL, submit_in_callback_during_free, &cb) > 0);
    REQUIRE(fq_submit_block(q, submit_in_body_during_free, NULL, NULL, &body) > 0);
    /* Running, not only started: one cancelled before a worker took it up
     * would end without its body. */
    REQUIRE(WAIT_UNTIL(atomic_load(&body.body_started) == 1, FQT_LONG_MS));
    fqt_engine_free(e);
    CHECK_EQ_INT(atomic_load(&cb.self.calls), 1);
    CHECK_EQ_INT(cb.self.outcome, FQ_CANCELLED);
    CHECK_EQ_INT(atomic_load(&cb.attempts), SUBMIT_KINDS);
    CHECK_EQ_INT(atomic_load(&cb.shutdown_rcs), SUBMIT_KINDS);
    CHECK_EQ_INT(atomic_load(&body.attempts), SUBMIT_KINDS);
    CHECK_EQ_INT(atomic_load(&body.shutdown_rcs), SUBMIT_KINDS);
    CHECK_EQ_INT(atomic_load(&cb.queue_new_null), 1);
    CHECK_EQ_INT(atomic_load(&body.queue_new_null), 1);
    /* nothing rejected ran or was called back, also not later */
    fqt_sleep_ms(50);
    for (int i = 0; i < SUBMIT_KINDS; i++) {
        check_never_called(&cb.rejected[i], "submit from a callback during fq_engine_free");
        check_never_called(&body.rejected[i], "submit from a body during fq_engine_free");
    }
    rec_clear(&cb.self);
}

TEST(misuse_submit_while_engine_frees) {
    submit_during_free(NULL);
}

TEST(misuse_submit_while_engine_frees_poll_mode) {
    submit_during_free("poll");
}

/* ------------------------------------------------------- huge values */

static void expect_bad_block_options(fq_queue *q, const char *text, const char *key) {
    json_t *o = fqt_json(text);
    rec r = {0};
    fq_op_id id = fq_submit_block(q, body_tag, o, rec_done, &r);
    if (id != FQ_ERR_INVALID)
        FAILF("submit_block(options %.200s) = %lld, want FQ_ERR_INVALID", text, (long long)id);
    else if (!strstr(fq_last_error(), key))
        FAILF("submit_block(options %.200s): message \"%s\" does not name \"%s\"", text,
              fq_last_error(), key);
    json_decref(o);
    if (id > 0) fq_engine_wait_idle(NULL, 0);
    check_never_called(&r, text);
}

static void expect_bad_request_options(fq_queue *q, const char *text, const char *key) {
    json_t *o = fqt_json(text);
    json_t *req = fqt_json("{\"url\": \"http://127.0.0.1:9/\"}");
    rec r = {0};
    fq_op_id id = fq_submit_request(q, req, o, rec_done, &r);
    if (id != FQ_ERR_INVALID)
        FAILF("submit_request(options %.200s) = %lld, want FQ_ERR_INVALID", text, (long long)id);
    else if (!strstr(fq_last_error(), key))
        FAILF("submit_request(options %.200s): message \"%s\" does not name \"%s\"", text,
              fq_last_error(), key);
    json_decref(o);
    json_decref(req);
    check_never_called(&r, text);
}

static void expect_bad_config(const char *text, const char *key) {
    json_t *c = fqt_json(text);
    char errbuf[256] = "";
    fq_engine *e = fq_engine_new(c, errbuf, sizeof errbuf);
    if (e) {
        FAILF("fq_engine_new(%s) accepted it", text);
        fq_engine_free(e);
    } else if (!strstr(errbuf, key)) {
        FAILF("fq_engine_new(%s): message \"%s\" does not name \"%s\"", text, errbuf, key);
    }
    json_decref(c);
}

TEST(misuse_huge_option_values) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    expect_bad_block_options(q, "{\"max_wait_ms\": 1e12}", "max_wait_ms");
    expect_bad_block_options(q, "{\"max_wait_ms\": 1000000000000}", "max_wait_ms");
    expect_bad_block_options(q, "{\"max_wait_ms\": 4611686018427387904}", "max_wait_ms");
    expect_bad_block_options(q, "{\"max_wait_ms\": -1}", "max_wait_ms");
    expect_bad_block_options(q, "{\"priority\": 4611686018427387904}", "priority");
    expect_bad_block_options(q, "{\"priority\": -4611686018427387904}", "priority");
    expect_bad_block_options(q, "{\"priority\": 4.0}", "priority");
    expect_bad_block_options(q, "{\"priority\": 1e300}", "priority");
    expect_bad_block_options(q, "{\"depends_on\": [1e300]}", "depends_on");
    expect_bad_block_options(q, "{\"depends_on\": [-4611686018427387904]}", "depends_on");
    expect_bad_request_options(q, "{\"timeout_ms\": 4611686018427387904}", "timeout_ms");
    expect_bad_request_options(q, "{\"connect_timeout_ms\": 1e12}", "connect_timeout_ms");
    expect_bad_request_options(q, "{\"max_redirects\": 4611686018427387904}", "max_redirects");
    expect_bad_request_options(q, "{\"max_response_bytes\": 4611686018427387904}",
                               "max_response_bytes");
    expect_bad_request_options(q, "{\"max_json_depth\": 4611686018427387904}", "max_json_depth");
    expect_bad_request_options(q, "{\"max_json_depth\": 2049}", "max_json_depth"); /* over jansson's limit */
    expect_bad_request_options(q, "{\"progress_interval_ms\": 4611686018427387904}",
                               "progress_interval_ms");
    /* an interval turns progress on: beside "progress": false one would be ignored */
    expect_bad_request_options(q, "{\"progress\": false, \"progress_interval_ms\": 10}",
                               "turns progress events on");
    expect_bad_request_options(q, "{\"retry\": {\"max\": 4611686018427387904}}", "max");
    expect_bad_request_options(q, "{\"retry\": {\"base\": 1e300}}", "base");
    expect_bad_request_options(q, "{\"retry\": {\"max_delay\": 1e300}}", "max_delay");
    expect_bad_request_options(q, "{\"retry\": {\"on\": [4611686018427387904]}}", "on");
    expect_bad_config("{\"workers\": 4611686018427387904}", "workers");
    expect_bad_config("{\"history\": 4611686018427387904}", "history");
    expect_bad_config("{\"aging_ms\": 1e12}", "aging_ms");
    expect_bad_config("{\"max_per_host\": 4611686018427387904}", "max_per_host");
    expect_bad_config("{\"timeout_ms\": 4611686018427387904}", "timeout_ms");
    expect_bad_config("{\"max_wait_ms\": 1000000000000}", "max_wait_ms");
    expect_bad_config("{\"rate_limits\": {\"*\": {\"per_second\": 1e300}}}", "per_second");
    expect_bad_config("{\"rate_limits\": {\"*\": {\"per_second\": 1, \"burst\": 1e300}}}", "burst");
    expect_bad_config("{\"cache\": {\"max_bytes\": 4611686018427387904}}", "max_bytes");
    /* empty strings that cannot mean anything: refused, naming the key */
    expect_bad_config("{\"ca_file\": \"\"}", "config.ca_file");
    expect_bad_config("{\"cache\": {\"path\": \"\"}}", "config.cache.path");
    expect_bad_request_options(q, "{\"ca_file\": \"\"}", "options.ca_file");
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(fqt_stat(e, "submitted", -1), 0);

    /* huge but valid: accepted */
    fq_queue *wide = fq_queue_new(e, "wide", INT_MAX);
    CHECK(wide != NULL);
    CHECK_OK(fq_queue_set_max_concurrent(q, INT_MAX));
    CHECK_OK(fq_queue_set_max_concurrent(q, 1));
    rec ok = {0};
    CHECK(fqt_block(q, body_tag, "{\"max_wait_ms\": 86400000}", rec_done, &ok) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    check_once(&ok, FQ_SUCCEEDED, FQ_OK, "op with a one-day max_wait_ms");
    rec_clear(&ok);
    fqt_engine_free(e);
}

typedef struct {
    atomic_int calls;
    int outcome;
} light;

static void light_done(const fq_result *res, void *userdata) {
    light *l = userdata;
    l->outcome = (int)fq_result_outcome(res);
    atomic_fetch_add(&l->calls, 1);
}

TEST(misuse_depends_on_100000_ids) {
    enum { N = 100000 };
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    fq_queue *paused = fqt_queue(e, "paused", 1);
    CHECK_OK(fq_queue_set_suspended(paused, true));

    /* 100 000 unknown ids: FQ_ERR_NOT_FOUND naming one, quickly */
    json_t *a = json_array();
    for (int i = 0; i < N; i++) json_array_append_new(a, json_integer(900000000LL + i));
    json_t *o = json_pack("{s:o}", "depends_on", a);
    rec r = {0};
    long long t0 = fqt_now_ms();
    EXPECT_ST(fq_submit_block(q, body_tag, o, rec_done, &r), FQ_ERR_NOT_FOUND);
    CHECK_CONTAINS(fq_last_error(), "9000");
    json_decref(o);
    long long took = fqt_now_ms() - t0;
    h_note("rejecting 100000 unknown ids took %lld ms", took);

    /* 100 000 times the same pending id: accepted, waits for it, runs once */
    rec dep = {0}, dup = {0};
    fq_op_id d = fqt_block(paused, body_tag, NULL, rec_done, &dep);
    REQUIRE(d > 0);
    a = json_array();
    for (int i = 0; i < N; i++) json_array_append_new(a, json_integer(d));
    o = json_pack("{s:o}", "depends_on", a);
    fq_op_id id = fq_submit_block(q, body_tag, o, rec_done, &dup);
    json_decref(o);
    if (id <= 0) FAILF("depends_on with one id 100000 times: %lld (%s)", (long long)id, fq_last_error());

    /* 100 000 distinct pending ids: accepted, runs after all of them */
    enum { M = N };
    light *many = calloc(M, sizeof *many);
    REQUIRE(many);
    a = json_array();
    for (int i = 0; i < M; i++) {
        fq_op_id x = fq_submit_block(paused, body_noop, NULL, light_done, &many[i]);
        if (x <= 0) {
            FAILF("submit %d: %lld", i, (long long)x);
            break;
        }
        json_array_append_new(a, json_integer(x));
    }
    o = json_pack("{s:o}", "depends_on", a);
    rec last = {0};
    t0 = fqt_now_ms();
    fq_op_id lid = fq_submit_block(q, body_tag, o, rec_done, &last);
    took = fqt_now_ms() - t0;
    json_decref(o);
    if (lid <= 0) FAILF("depends_on 100000 pending ids: %lld (%s)", (long long)lid, fq_last_error());
    h_note("submit with 100000 dependencies took %lld ms", took);
    CHECK_EQ_INT(atomic_load(&last.body_runs), 0);
    CHECK_OK(fq_queue_set_suspended(paused, false));
    CHECK_OK(fq_engine_wait_idle(e, h_scaled_ms(120000)));
    check_once(&dep, FQ_SUCCEEDED, FQ_OK, "dependency");
    if (id > 0) {
        check_once(&dup, FQ_SUCCEEDED, FQ_OK, "dependent on one id 100000 times");
        CHECK(dup.start_seq > dep.end_seq);
    }
    if (lid > 0) {
        check_once(&last, FQ_SUCCEEDED, FQ_OK, "dependent on 100000 ids");
        int bad = 0;
        for (int i = 0; i < M; i++)
            if (atomic_load(&many[i].calls) != 1 || many[i].outcome != FQ_SUCCEEDED) bad++;
        CHECK_EQ_INT(bad, 0);
    }
    CHECK_EQ_INT(atomic_load(&r.calls), 0);
    free(many);
    rec_clear(&dep);
    rec_clear(&dup);
    rec_clear(&last);
    fqt_engine_free(e);
}

typedef struct {
    rec r;
    size_t error_len;
    bool error_intact;
    const char *want;
} bigerr;

static void bigerr_done(const fq_result *res, void *userdata) {
    bigerr *b = userdata;
    const char *m = fq_result_error(res);
    b->error_len = m ? strlen(m) : 0;
    b->error_intact = m && b->want && strcmp(m, b->want) == 0;
    rec_done(res, &b->r);
}

TEST(misuse_enormous_strings) {
    enum { BIG = 16 << 20 };
    char *big = malloc(BIG + 1);
    REQUIRE(big);
    memset(big, 'g', BIG);
    big[BIG] = '\0';
    fq_engine *e = fqt_engine(NULL);
    fq_queue *paused = fqt_queue(e, "paused", 1);
    CHECK_OK(fq_queue_set_suspended(paused, true));

    /* a 16 MiB group: a string tag like any other */
    json_t *o = json_pack("{s:s}", "group", big);
    rec g = {0}, small = {0};
    CHECK(fq_submit_block(paused, body_tag, o, rec_done, &g) > 0);
    json_decref(o);
    CHECK(fqt_block(paused, body_tag, "{\"group\": \"g\"}", rec_done, &small) > 0);
    big[BIG - 1] = 'h'; /* a different group of the same length */
    CHECK_EQ_INT(fq_cancel_group(e, big), 0);
    big[BIG - 1] = 'g';
    CHECK_EQ_INT(fq_cancel_group(e, big), 1);
    CHECK(WAIT_UNTIL(atomic_load(&g.calls) == 1, FQT_LONG_MS));
    check_once(&g, FQ_CANCELLED, FQ_ERR_CANCELLED, "op of a 16 MiB group");
    CHECK_EQ_INT(atomic_load(&small.calls), 0);

    /* a 1 MiB queue name: copied, a key of the stats */
    big[1 << 20] = '\0';
    fq_queue *named = fq_queue_new(e, big, 1);
    CHECK(named != NULL);
    json_t *st = fq_engine_stats(e);
    CHECK(json_object_get(json_object_get(st, "queues"), big) != NULL);
    json_decref(st);
    fq_queue_free(named);

    /* 1 MiB user agent, header value and search query: over the request
     * head's limit (libcurl failed them as "out of memory", a network error
     * that was retried), refused at submit with no callback; 900 000 bytes
     * are accepted, and refused like any request by the closed port */
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/x", fqt_closed_port());
    fq_queue *net = fqt_queue(e, "net", 4);
    char tmpl[96];
    snprintf(tmpl, sizeof tmpl, "http://127.0.0.1:%d/s?q={query}", fqt_closed_port());
    json_t *so = json_pack("{s:s}", "url", tmpl);
    json_t *plain = json_pack("{s:s}", "url", url);
    for (int round = 0; round < 2; round++) {
        big[round == 0 ? 1 << 20 : 900000] = '\0';
        json_t *req = json_pack("{s:s, s:{s:s}}", "url", url, "headers", "x-big", big);
        json_t *ua = json_pack("{s:s}", "user_agent", big);
        rec n[3];
        memset(n, 0, sizeof n);
        fq_op_id ids[3] = {fq_submit_request(net, req, NULL, rec_done, &n[0]),
                           fq_submit_request(net, plain, ua, rec_done, &n[1]),
                           fq_submit_search(net, big, so, rec_done, &n[2])};
        if (round == 0) CHECK_CONTAINS(fq_last_error(), "over the limit of 1000000");
        json_decref(req);
        json_decref(ua);
        CHECK_OK(fq_queue_wait(net, FQT_LONG_MS));
        for (int i = 0; i < 3; i++) {
            if (round == 0) {
                CHECK_EQ_INT(ids[i], FQ_ERR_INVALID);
                check_never_called(&n[i], "a 1 MiB request head");
            } else {
                CHECK(ids[i] > 0);
                check_once(&n[i], FQ_FAILED, FQ_ERR_NETWORK, "a 900 000-byte string to a closed port");
            }
        }
        rec_clear_all(n, 3);
    }
    json_decref(plain);
    json_decref(so);

    CHECK_OK(fq_queue_set_suspended(paused, false));
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    check_once(&small, FQ_SUCCEEDED, FQ_OK, "op of group g");
    rec_clear(&g);
    rec_clear(&small);
    fqt_engine_free(e);
    free(big);
}

/* A block body failing with the 16 MiB message kept in a bigerr. */
static json_t *body_big_error2(fq_op *op, void *userdata) {
    bigerr *b = userdata;
    CHECK_OK(fq_op_set_error(op, b->want));
    return NULL;
}
static void async_big_error(fq_op *op, void *userdata) {
    bigerr *b = userdata;
    CHECK_OK(fq_op_finish(op, json_string("discarded"), b->want));
}

TEST(misuse_enormous_error_messages) {
    enum { BIG = 16 << 20 };
    char *big = malloc(BIG + 1);
    REQUIRE(big);
    for (size_t i = 0; i < BIG; i++) big[i] = (char)('a' + i % 26);
    big[BIG] = '\0';
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    bigerr b1, b2;
    memset(&b1, 0, sizeof b1);
    memset(&b2, 0, sizeof b2);
    b1.want = b2.want = big;
    CHECK(fq_submit_block(q, body_big_error2, NULL, bigerr_done, &b1) > 0);
    CHECK(fq_submit_async(q, async_big_error, NULL, bigerr_done, &b2) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    check_once(&b1.r, FQ_FAILED, FQ_ERR_OPERATION, "block failing with a 16 MiB message");
    check_once(&b2.r, FQ_FAILED, FQ_ERR_OPERATION, "async failing with a 16 MiB message");
    CHECK(b1.error_intact);
    CHECK(b2.error_intact);
    CHECK_EQ_INT(b1.error_len, BIG);
    CHECK(b2.r.value == NULL);
    rec_clear(&b1.r);
    rec_clear(&b2.r);
    fqt_engine_free(e);
    free(big);
}

/* ------------------------------------------------ non-object JSON */

static const char *not_objects[] = {"[]", "[{\"priority\": 4}]", "\"priority\"", "0", "1.5",
                                    "true", "false", "null"};
enum { N_NOT_OBJECTS = sizeof not_objects / sizeof not_objects[0] };

TEST(misuse_non_object_json) {
    for (int i = 0; i < N_NOT_OBJECTS; i++) {
        json_t *c = fqt_json(not_objects[i]);
        char errbuf[256] = "";
        fq_engine *x = fq_engine_new(c, errbuf, sizeof errbuf);
        if (x) {
            FAILF("fq_engine_new(config %s) accepted it", not_objects[i]);
            fq_engine_free(x);
        } else if (!errbuf[0]) {
            FAILF("fq_engine_new(config %s): no message", not_objects[i]);
        }
        json_decref(c);
    }
    fq_engine *e = fqt_engine("{\"search\": {\"url\": \"http://127.0.0.1:9/?q={query}\"}}");
    fq_queue *q = fqt_queue(e, "q", 1);
    json_t *req = fqt_json("{\"url\": \"http://127.0.0.1:9/\"}");
    const char *qs[] = {"a"};
    rec r = {0};
    for (int i = 0; i < N_NOT_OBJECTS; i++) {
        json_t *o = fqt_json(not_objects[i]);
        EXPECT_ST(fq_submit_block(q, body_tag, o, rec_done, &r), FQ_ERR_INVALID);
        EXPECT_ST(fq_submit_async(q, body_async_capture, o, rec_done, &r), FQ_ERR_INVALID);
        EXPECT_ST(fq_submit_request(q, req, o, rec_done, &r), FQ_ERR_INVALID);
        EXPECT_ST(fq_submit_search(q, "a", o, rec_done, &r), FQ_ERR_INVALID);
        EXPECT_ST(fq_submit_search_all(q, qs, 1, o, rec_done, &r), FQ_ERR_INVALID);
        EXPECT_ST(fq_submit_request(q, o, NULL, rec_done, &r), FQ_ERR_INVALID); /* as the request */
        json_decref(o);
    }
    /* nested objects of the wrong type */
    static const struct {
        const char *request, *options, *key;
    } nested[] = {
        {"{\"url\": \"http://127.0.0.1:9/\", \"headers\": [\"a: b\"]}", NULL, "headers"},
        {"{\"url\": \"http://127.0.0.1:9/\", \"headers\": \"a: b\"}", NULL, "headers"},
        {"{\"url\": \"http://127.0.0.1:9/\", \"headers\": {\"a\": 1}}", NULL, "a"},
        {"{\"url\": \"http://127.0.0.1:9/\", \"query\": \"a=b\"}", NULL, "query"},
        {"{\"url\": \"http://127.0.0.1:9/\", \"query\": {\"a\": [1]}}", NULL, "a"},
        {"{\"url\": [\"http://127.0.0.1:9/\"]}", NULL, "url"},
        {"{\"url\": \"http://127.0.0.1:9/\", \"method\": 5}", NULL, "method"},
        {"{\"url\": \"http://127.0.0.1:9/\"}", "{\"retry\": [1]}", "retry"},
        {"{\"url\": \"http://127.0.0.1:9/\"}", "{\"retry\": \"twice\"}", "retry"},
        {"{\"url\": \"http://127.0.0.1:9/\"}", "{\"retry\": {\"on\": 500}}", "on"},
        {"{\"url\": \"http://127.0.0.1:9/\"}", "{\"accept_status\": 404}", "accept_status"},
        {"{\"url\": \"http://127.0.0.1:9/\"}", "{\"cache\": {\"mode\": \"default\"}}", "cache"},
    };
    for (size_t i = 0; i < sizeof nested / sizeof *nested; i++) {
        json_t *rq = fqt_json(nested[i].request);
        json_t *o = nested[i].options ? fqt_json(nested[i].options) : NULL;
        if (EXPECT_ST(fq_submit_request(q, rq, o, rec_done, &r), FQ_ERR_INVALID))
            EXPECT_MSG(nested[i].key);
        json_decref(rq);
        json_decref(o);
    }
    json_t *so = fqt_json("{\"store\": \"items.db\"}");
    EXPECT_ST(fq_submit_search(q, "a", so, rec_done, &r), FQ_ERR_INVALID);
    EXPECT_MSG("store");
    json_decref(so);
    expect_bad_config("{\"search\": [\"http://x/?q={query}\"]}", "search");
    expect_bad_config("{\"rate_limits\": [1]}", "rate_limits");
    expect_bad_config("{\"rate_limits\": {\"*\": 5}}", "*");
    /* keys that could never match a host, and two spellings of one host (the
     * second used to replace the first without a word) */
    expect_bad_config("{\"rate_limits\": {\"http://a.com/\": {\"per_second\": 1}}}", "\"http://a.com/\" is not");
    expect_bad_config("{\"rate_limits\": {\"\": {\"per_second\": 1}}}", "\"\" is not");
    expect_bad_config("{\"rate_limits\": {\"a.com:99999\": {\"per_second\": 1}}}", "\"a.com:99999\" is not");
    expect_bad_config("{\"rate_limits\": {\"u@a.com\": {\"per_second\": 1}}}", "\"u@a.com\" is not");
    /* spelled otherwise than a request's host:port is named, so never matched */
    expect_bad_config("{\"rate_limits\": {\"a.com:\": {\"per_second\": 1}}}", "\"a.com:\" is not");
    expect_bad_config("{\"rate_limits\": {\"a.com:08080\": {\"per_second\": 1}}}", "\"a.com:08080\" is not");
    expect_bad_config("{\"rate_limits\": {\"*:8080\": {\"per_second\": 1}}}", "\"*:8080\" is not");
    expect_bad_config("{\"rate_limits\": {\"b\u00fccher.example\": {\"per_second\": 1}}}", "is not");
    expect_bad_config("{\"rate_limits\": {\"localhost:8080\": {\"per_second\": 1}, "
                      "\"LocalHost:8080\": {\"per_second\": 1000}}}", "names the same host");
    {
        char err[256] = "";
        json_t *good = fqt_json("{\"rate_limits\": {\"*\": {\"per_second\": 5}, \"a.com\": {\"per_second\": 1}, "
                                "\"[::1]:8080\": {\"per_second\": 2}, \"127.0.0.1:9\": {\"per_second\": 3}, "
                                "\"A.com:80\": {\"per_second\": 4}, \"b.com:443\": {\"per_second\": 4}, "
                                "\"[::1]\": {\"per_second\": 4}}}");
        fq_engine *ok = fq_engine_new(good, err, sizeof err);
        if (!ok) FAILF("valid rate_limits refused: %s", err);
        else fq_engine_free(ok);
        json_decref(good);
    }
    expect_bad_config("{\"cache\": \"big\"}", "cache");
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    check_never_called(&r, "non-object JSON");
    CHECK_EQ_INT(fqt_stat(e, "submitted", -1), 0);
    json_decref(req);
    fqt_engine_free(e);
}

/* -------------------------------------------------- op handle misuse */

typedef struct {
    rec r;
    int rc_first, rc_second, rc_set_error;
    size_t second_refcount;
    /* The op ends at the first fq_op_finish, so the waits can return while
     * this start function still runs: the test waits for this flag too. */
    atomic_bool start_returned;
} twice;

/* The second fq_op_finish comes from the start function itself, while the
 * library still runs it (see the header proposal in the report). */
static void async_finish_twice(fq_op *op, void *userdata) {
    twice *t = userdata;
    t->rc_set_error = fq_op_set_error(op, "not for async operations");
    t->rc_first = fq_op_finish(op, json_pack("{s:i}", "first", 1), NULL);
    json_t *v = stealable();
    t->rc_second = fq_op_finish(op, v, NULL);
    t->second_refcount = v->refcount;
    json_decref(v);
    atomic_store(&t->start_returned, true);
}

typedef struct {
    rec r;
    int rc_finish, rc_finish_err, rc_set_null, rc_set_twice;
    size_t finish_refcount;
    bool set_error_variant;
} wrongkind;

static json_t *block_misuses_handle(fq_op *op, void *userdata) {
    wrongkind *w = userdata;
    json_t *v = stealable();
    w->rc_finish = fq_op_finish(op, v, NULL);
    w->finish_refcount = v->refcount;
    json_decref(v);
    w->rc_finish_err = fq_op_finish(op, NULL, "an error");
    if (w->set_error_variant) {
        w->rc_set_null = fq_op_set_error(op, NULL);
        w->rc_set_twice = fq_op_set_error(op, "second message");
    }
    return json_pack("{s:s}", "block", "value");
}

TEST(misuse_op_handles_of_the_wrong_kind) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    twice t;
    memset(&t, 0, sizeof t);
    REQUIRE(fq_submit_async(q, async_finish_twice, NULL, rec_done, &t) > 0);
    wrongkind w, w2;
    memset(&w, 0, sizeof w);
    memset(&w2, 0, sizeof w2);
    w2.set_error_variant = true;
    REQUIRE(fq_submit_block(q, block_misuses_handle, NULL, rec_done, &w) > 0);
    REQUIRE(fq_submit_block(q, block_misuses_handle, NULL, rec_done, &w2) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    REQUIRE(WAIT_UNTIL(atomic_load(&t.start_returned), FQT_LONG_MS));

    /* fq_op_set_error on an async op; fq_op_finish twice */
    CHECK_EQ_INT(t.rc_set_error, FQ_ERR_STATE);
    CHECK_EQ_INT(t.rc_first, FQ_OK);
    CHECK_EQ_INT(t.rc_second, FQ_ERR_STATE);
    CHECK_EQ_INT(t.second_refcount, 1); /* the second value was released */
    check_once(&t.r, FQ_SUCCEEDED, FQ_OK, "async finished twice");
    CHECK_EQ_INT(fqt_int(t.r.value, "first", -1), 1);

    /* fq_op_finish on a block op: FQ_ERR_STATE, value released, no effect */
    CHECK_EQ_INT(w.rc_finish, FQ_ERR_STATE);
    CHECK_EQ_INT(w.rc_finish_err, FQ_ERR_STATE);
    CHECK_EQ_INT(w.finish_refcount, 1);
    check_once(&w.r, FQ_SUCCEEDED, FQ_OK, "block whose handle got fq_op_finish");
    CHECK_STR(json_string_value(json_object_get(w.r.value, "block")), "value");

    /* fq_op_set_error(op, NULL), then again: fails with the last message */
    CHECK_EQ_INT(w2.rc_set_null, FQ_OK);
    CHECK_EQ_INT(w2.rc_set_twice, FQ_OK);
    check_once(&w2.r, FQ_FAILED, FQ_ERR_OPERATION, "block with fq_op_set_error twice");
    CHECK_STR(w2.r.error, "second message");
    CHECK(w2.r.value == NULL);
    rec_clear(&t.r);
    rec_clear(&w.r);
    rec_clear(&w2.r);
    fqt_engine_free(e);
}

static json_t *body_set_error_null(fq_op *op, void *userdata) {
    (void)userdata;
    CHECK_OK(fq_op_set_error(op, NULL));
    return json_true();
}

TEST(misuse_set_error_null_message) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    rec r = {0};
    REQUIRE(fq_submit_block(q, body_set_error_null, NULL, rec_done, &r) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    check_once(&r, FQ_FAILED, FQ_ERR_OPERATION, "fq_op_set_error(op, NULL)");
    CHECK(r.has_error && r.error[0] != '\0');
    CHECK(r.value == NULL);
    rec_clear(&r);
    fqt_engine_free(e);
}

/* ------------------------------------------------ delivery modes, waits */

typedef struct {
    rec r;
    fq_engine *e;
    int rc_dispatch, rc_wait, rc_qwait;
    fq_queue *q;
} poll_reentry;

static void poll_cb(const fq_result *res, void *userdata) {
    poll_reentry *p = userdata;
    p->rc_dispatch = fq_engine_dispatch(p->e, 0);
    p->rc_wait = fq_engine_wait_idle(p->e, 0);
    p->rc_qwait = fq_queue_wait(p->q, 100);
    rec_done(res, &p->r);
}

TEST(misuse_dispatch_and_event_fd_by_delivery_mode) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    CHECK_EQ_INT(fq_engine_event_fd(e), -1);
    EXPECT_ST(fq_engine_dispatch(e, 0), FQ_ERR_STATE);
    EXPECT_ST(fq_engine_dispatch(e, 5), FQ_ERR_STATE);
    EXPECT_ST(fq_engine_dispatch(e, -1), FQ_ERR_STATE);
    rec r = {0};
    REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &r) > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    EXPECT_ST(fq_engine_dispatch(e, 0), FQ_ERR_STATE); /* also with nothing waiting */
    check_once(&r, FQ_SUCCEEDED, FQ_OK, "thread-mode op");
    CHECK(!pthread_equal(r.thread, pthread_self()));
    rec_clear(&r);
    fqt_engine_free(e);

    e = fqt_engine("{\"delivery\": \"poll\"}");
    q = fqt_queue(e, "q", 1);
    int fd = fq_engine_event_fd(e);
    CHECK(fd >= 0);
    CHECK_EQ_INT(fq_engine_event_fd(e), fd);
    CHECK_EQ_INT(fq_engine_dispatch(e, 0), 0); /* nothing waiting */
    poll_reentry p;
    memset(&p, 0, sizeof p);
    p.e = e;
    p.q = q;
    REQUIRE(fq_submit_block(q, body_tag, NULL, poll_cb, &p) > 0);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    CHECK(poll(&pfd, 1, h_scaled_ms(FQT_LONG_MS)) == 1);
    CHECK_EQ_INT(fq_engine_dispatch(e, -7), 1); /* max <= 0: all */
    check_once(&p.r, FQ_SUCCEEDED, FQ_OK, "poll-mode op");
    CHECK(pthread_equal(p.r.thread, pthread_self()));
    CHECK_EQ_INT(p.rc_dispatch, FQ_ERR_STATE);
    CHECK_EQ_INT(p.rc_wait, FQ_ERR_STATE);
    CHECK_EQ_INT(p.rc_qwait, FQ_ERR_STATE);
    rec_clear(&p.r);
    fqt_engine_free(e);
}

TEST(misuse_wait_with_timeout_zero) {
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    fq_queue *idle = fqt_queue(e, "idle", 1);
    CHECK_OK(fq_engine_wait_idle(e, 0)); /* nothing submitted */
    CHECK_OK(fq_queue_wait(q, 0));
    CHECK_OK(fq_queue_set_suspended(q, true));
    rec r = {0};
    REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &r) > 0);
    long long t0 = fqt_now_ms();
    EXPECT_ST(fq_engine_wait_idle(e, 0), FQ_ERR_TIMEOUT);
    EXPECT_MSG("timed out waiting for the engine to become idle"); /* not the from-a-callback message */
    EXPECT_ST(fq_queue_wait(q, 0), FQ_ERR_TIMEOUT);
    EXPECT_MSG("timed out waiting for queue \"q\"");
    EXPECT_ST(fq_engine_wait_idle(e, 1), FQ_ERR_TIMEOUT);
    EXPECT_MSG("timed out waiting for the engine to become idle");
    CHECK_OK(fq_queue_wait(idle, 0));
    long long took = fqt_now_ms() - t0;
    if (took > h_scaled_ms(1000)) FAILF("three waits with timeout 0/0/1 ms took %lld ms", took);
    CHECK_OK(fq_queue_set_suspended(q, false));
    CHECK_OK(fq_engine_wait_idle(e, -1)); /* forever, but it finishes */
    CHECK_OK(fq_queue_wait(q, INT_MIN));
    check_once(&r, FQ_SUCCEEDED, FQ_OK, "op waited for");
    rec_clear(&r);
    fqt_engine_free(e);

    /* poll mode: a wait with timeout 0 runs the callbacks already waiting */
    e = fqt_engine("{\"delivery\": \"poll\"}");
    q = fqt_queue(e, "q", 1);
    rec pr = {0};
    REQUIRE(fqt_block(q, body_tag, NULL, rec_done, &pr) > 0);
    struct pollfd pfd = {.fd = fq_engine_event_fd(e), .events = POLLIN};
    CHECK(poll(&pfd, 1, h_scaled_ms(FQT_LONG_MS)) == 1); /* finished, not delivered */
    CHECK_EQ_INT(atomic_load(&pr.calls), 0);
    CHECK_OK(fq_engine_wait_idle(e, 0));
    check_once(&pr, FQ_SUCCEEDED, FQ_OK, "poll-mode op delivered by a wait with timeout 0");
    CHECK(pthread_equal(pr.thread, pthread_self()));
    rec_clear(&pr);
    fqt_engine_free(e);
}

/* ----------------------------------------------------- errbuf sizes */

TEST(misuse_errbuf_sizes) {
    json_t *bad = fqt_json("{\"no_such_key\": 1}");
    char buf[16];
    memset(buf, 'X', sizeof buf);
    CHECK(fq_engine_new(bad, buf, 0) == NULL);
    CHECK(buf[0] == 'X'); /* errlen 0: not written */
    CHECK(fq_engine_new(bad, buf, 1) == NULL);
    CHECK(buf[0] == '\0' && buf[1] == 'X');
    memset(buf, 'X', sizeof buf);
    CHECK(fq_engine_new(bad, buf, sizeof buf) == NULL);
    CHECK(memchr(buf, '\0', sizeof buf) != NULL);
    CHECK(fq_engine_new(bad, NULL, 100) == NULL);
    CHECK_CONTAINS(fq_last_error(), "no_such_key");
    memset(buf, 'X', sizeof buf);
    CHECK(fq_store_open("/nonexistent-fetchq-dir/x/s.db", buf, 0) == NULL);
    CHECK(buf[0] == 'X');
    CHECK(fq_store_open("/nonexistent-fetchq-dir/x/s.db", buf, 1) == NULL);
    CHECK(buf[0] == '\0');
    json_decref(bad);
}

/* ------------------------------------------- log and event functions */

typedef struct {
    fq_engine *e;
    atomic_int lines, stats_ok, free_calls, free_state;
    atomic_int free_other;
} logreentry;

/* A log function that calls back into the library on every line: the header
 * allows it for callbacks ("never called while the library holds a lock"). */
static void reentrant_log(int level, const char *message, void *userdata) {
    (void)level;
    (void)message;
    logreentry *l = userdata;
    atomic_fetch_add(&l->lines, 1);
    json_t *st = fq_engine_stats(l->e);
    if (json_is_object(st)) atomic_fetch_add(&l->stats_ok, 1);
    json_decref(st);
    int rc = fq_engine_free(l->e);
    atomic_fetch_add(&l->free_calls, 1);
    if (rc == FQ_ERR_STATE)
        atomic_fetch_add(&l->free_state, 1);
    else
        atomic_fetch_add(&l->free_other, 1);
}

/* An engine logging at "trace" whose first line ("engine started", logged
 * before a log function can be set) does not clutter the test output. */
static fq_engine *quiet_tracing_engine(void) {
    fflush(stderr);
    int saved = dup(2), null = open("/dev/null", O_WRONLY);
    if (saved >= 0 && null >= 0) dup2(null, 2);
    fq_engine *e = fqt_engine("{\"log\": \"trace\"}");
    if (saved >= 0) {
        dup2(saved, 2);
        close(saved);
    }
    if (null >= 0) close(null);
    return e;
}

TEST_T(misuse_log_fn_calls_into_the_library, 15) {
    logreentry l;
    memset(&l, 0, sizeof l);
    l.e = quiet_tracing_engine();
    CHECK_OK(fq_engine_set_log_fn(l.e, reentrant_log, &l));
    fq_queue *q = fqt_queue(l.e, "q", 1);
    rec r = {0};
    REQUIRE(fqt_block(q, body_fail, NULL, rec_done, &r) > 0); /* "operation failed" */
    CHECK_OK(fq_engine_wait_idle(l.e, FQT_LONG_MS));
    check_once(&r, FQ_FAILED, FQ_ERR_OPERATION, "failing op");
    fqt_engine_free(l.e); /* logs "engine shutting down" */
    h_note("%d log lines", atomic_load(&l.lines));
    CHECK(atomic_load(&l.lines) >= 1);
    CHECK_EQ_INT(atomic_load(&l.stats_ok), atomic_load(&l.lines));
    CHECK_EQ_INT(atomic_load(&l.free_other), 0);
    rec_clear(&r);
}

TEST_T(misuse_log_fn_calls_into_the_library_on_retry, 20) {
    fqt_server srv;
    fqt_server_start(&srv, NULL);
    logreentry l;
    memset(&l, 0, sizeof l);
    l.e = quiet_tracing_engine();
    CHECK_OK(fq_engine_set_log_fn(l.e, reentrant_log, &l));
    fq_queue *q = fqt_queue(l.e, "q", 1);
    char url[256], req[320];
    fqt_url(&srv, "/flaky?key=misuse-log&fail=1", url, sizeof url);
    snprintf(req, sizeof req, "{\"url\": \"%s\"}", url);
    rec r = {0};
    REQUIRE(fqt_request(q, req, "{\"retry\": {\"max\": 1, \"base\": 0.001}}", rec_done, &r) > 0);
    CHECK_OK(fq_engine_wait_idle(l.e, FQT_LONG_MS)); /* logs "retrying" */
    check_once(&r, FQ_SUCCEEDED, FQ_OK, "retried request");
    CHECK_EQ_INT(atomic_load(&l.free_other), 0);
    fqt_engine_free(l.e);
    CHECK_EQ_INT(atomic_load(&l.free_other), 0);
    CHECK(atomic_load(&l.lines) >= 1);
    CHECK_EQ_INT(atomic_load(&l.stats_ok), atomic_load(&l.lines));
    rec_clear(&r);
    fqt_server_stop(&srv);
}

typedef struct {
    fq_engine *e;
    atomic_int events, free_state, free_other, wait_state;
} eventreentry;

static void reentrant_event(const fq_event *ev, void *userdata) {
    (void)ev;
    eventreentry *x = userdata;
    atomic_fetch_add(&x->events, 1);
    int rc = fq_engine_free(x->e);
    if (rc == FQ_ERR_STATE)
        atomic_fetch_add(&x->free_state, 1);
    else
        atomic_fetch_add(&x->free_other, 1);
    if (fq_engine_wait_idle(x->e, 0) == FQ_ERR_STATE) atomic_fetch_add(&x->wait_state, 1);
}

TEST_T(misuse_engine_free_from_an_event_fn, 60) {
    fqt_server srv;
    fqt_server_start(&srv, NULL);
    eventreentry x;
    memset(&x, 0, sizeof x);
    x.e = fqt_engine(NULL);
    CHECK_OK(fq_engine_set_event_fn(x.e, reentrant_event, &x));
    fq_queue *q = fqt_queue(x.e, "q", 1);
    char url[256], req[320];
    fqt_url(&srv, "/drip?bytes=400&chunk=100&interval_ms=20", url, sizeof url);
    snprintf(req, sizeof req, "{\"url\": \"%s\"}", url);
    rec r = {0};
    REQUIRE(fqt_request(q, req, "{\"progress_interval_ms\": 0}", rec_done, &r) > 0);
    CHECK_OK(fq_engine_wait_idle(x.e, FQT_LONG_MS));
    check_once(&r, FQ_SUCCEEDED, FQ_OK, "request with progress events");
    CHECK(atomic_load(&x.events) >= 1);
    CHECK_EQ_INT(atomic_load(&x.free_state), atomic_load(&x.events));
    CHECK_EQ_INT(atomic_load(&x.wait_state), atomic_load(&x.events));
    CHECK_EQ_INT(atomic_load(&x.free_other), 0);
    rec_clear(&r);
    fqt_engine_free(x.e);
    fqt_server_stop(&srv);
}

/* A file that cannot be opened says why, in the system's words: SQLite's
 * "unable to open database file" alone did not, nor "eventfd failed: errno
 * 24". Out of descriptors: every descriptor up to a low RLIMIT_NOFILE is
 * taken, then given back. */
TEST(misuse_files_that_cannot_be_opened_say_why) {
    char errbuf[512] = "";
    CHECK(fq_store_open("/nonexistent-fetchq-dir/x/store.db", errbuf, sizeof errbuf) == NULL);
    CHECK_CONTAINS(errbuf, "No such file or directory");
    CHECK_EQ_INT(fq_last_status(), FQ_ERR_STORE);
    CHECK(fq_store_open(NULL, errbuf, sizeof errbuf) == NULL);
    CHECK_EQ_INT(fq_last_status(), FQ_ERR_INVALID);

    char dir[] = "/tmp/fq-misuse-nofile-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/store.db", dir);
    struct rlimit old;
    REQUIRE(getrlimit(RLIMIT_NOFILE, &old) == 0);
    struct rlimit low = old;
    low.rlim_cur = 64;
    REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
    int taken[64], n = 0;
    while (n < 64) {
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0) break;
        taken[n++] = fd;
    }
    fq_store *s = fq_store_open(path, errbuf, sizeof errbuf);
    char store_message[512];
    snprintf(store_message, sizeof store_message, "%s", errbuf);
    int store_status = fq_last_status();
    json_t *poll_config = fqt_json("{\"delivery\": \"poll\"}");
    fq_engine *e = fq_engine_new(poll_config, errbuf, sizeof errbuf);
    int engine_status = fq_last_status();
    json_decref(poll_config);
    for (int i = 0; i < n; i++) close(taken[i]);
    REQUIRE(setrlimit(RLIMIT_NOFILE, &old) == 0);
    CHECK(s == NULL);
    CHECK_CONTAINS(store_message, "Too many open files");
    CHECK(e == NULL);
    CHECK_CONTAINS(errbuf, "Too many open files");
    /* what fq_last_status tells a caller that got NULL */
    CHECK_EQ_INT(store_status, FQ_ERR_STORE);
    CHECK_EQ_INT(engine_status, FQ_ERR_NOMEM);
    fq_store_free(s);
    fq_engine_free(e);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK_EQ_INT(system(cmd), 0);
}
