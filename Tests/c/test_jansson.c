/* jansson's allocator as fetchq.h describes it ("jansson's allocation
 * functions"): the first engine sets fetchq's caching functions only over
 * jansson's own malloc/free, not with FETCHQ_JANSSON_CACHE=0 and not over
 * another allocator; the blocks stay malloc blocks (a json_dumps string may
 * be free()d), on the application's threads and on the engine's (which keep
 * freed blocks); a block freed again soon after on the same engine thread
 * stops the process with a message. Each case runs in a child of its own (the setting is process-wide
 * and the harness may run tests in one process), which starts from jansson's
 * defaults. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fqt.h"

/* Runs fn in a child whose standard error is captured into err; returns the
 * wait status (or -1). */
static int in_child(int (*fn)(void), char *err, size_t errlen) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        json_set_alloc_funcs(malloc, free);
        _exit(fn());
    }
    close(fds[1]);
    size_t used = 0;
    ssize_t n;
    char rest[4096];
    for (;;) { /* read to the end (the child must not block on a full pipe) */
        if (used + 1 < errlen) n = read(fds[0], err + used, errlen - 1 - used);
        else n = read(fds[0], rest, sizeof rest);
        if (n <= 0) break;
        if (used + 1 < errlen) used += (size_t)n;
    }
    err[used] = '\0';
    close(fds[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return status;
}

static bool defaults(void) {
    json_malloc_t m = NULL;
    json_free_t f = NULL;
    json_get_alloc_funcs(&m, &f);
    return m == malloc && f == free;
}

/* Values made, printed and freed, and blocks passed between malloc/free and
 * jansson's functions: 0, or the step that went wrong. */
static int make_values(void) {
    for (int i = 0; i < 1000; i++) {
        json_t *v = json_pack("{s:s,s:i,s:[f,b]}", "name", "a value", "n", i, "list", 1.5, 1);
        if (!v) return 1;
        char *text = json_dumps(v, JSON_COMPACT);
        if (!text || strncmp(text, "{\"name\":\"a value\"", 17) != 0) return 2;
        free(text); /* jansson's documentation: free() */
        json_decref(v);
    }
    json_malloc_t m = NULL;
    json_free_t f = NULL;
    json_get_alloc_funcs(&m, &f);
    f(malloc(48)); /* a block from malloc given to jansson's free function */
    void *p = m(48);
    free(p); /* and one from jansson's malloc function to free() */
    return 0;
}

static json_t *make_values_body(fq_op *op, void *ud) {
    (void)op;
    *(int *)ud = make_values();
    return NULL;
}

/* Runs body as a block operation on one of the engine's workers (which keep
 * freed blocks) and waits for it; 0 when it ran. */
static int on_a_worker(fq_engine *e, fq_block_fn body, void *ud) {
    fq_queue *q = fq_queue_new(e, "jc", 1);
    if (!q || fq_submit_block(q, body, NULL, NULL, ud) <= 0) return 1;
    return fq_queue_wait(q, 10000) == FQ_OK ? 0 : 2;
}

/* Exit codes: 0 ok, 10+ a step that went wrong. */
static int installs_and_mixes_with_malloc(void) {
    unsetenv("FETCHQ_JANSSON_CACHE");
    if (!defaults()) return 10;
    fq_engine *e = fq_engine_new(NULL, NULL, 0);
    if (!e) return 11;
    if (defaults()) return 12;
    if (make_values() != 0) return 13; /* here (a thread that keeps nothing) */
    int worker_rc = -1;
    if (on_a_worker(e, make_values_body, &worker_rc) != 0) return 14;
    if (worker_rc != 0) return 15; /* on a worker (which keeps blocks) */
    if (fq_engine_free(e) != FQ_OK) return 17;
    return 0;
}

static int off_with_the_environment_variable(void) {
    setenv("FETCHQ_JANSSON_CACHE", "0", 1);
    fq_engine *e = fq_engine_new(NULL, NULL, 0);
    if (!e) return 11;
    int rc = defaults() ? 0 : 12;
    fq_engine_free(e);
    return rc;
}

static long counted;
static void *counting_malloc(size_t n) {
    counted++;
    return malloc(n);
}

static int another_allocator_left_alone(void) {
    unsetenv("FETCHQ_JANSSON_CACHE");
    json_set_alloc_funcs(counting_malloc, free);
    fq_engine *e = fq_engine_new(NULL, NULL, 0);
    if (!e) return 11;
    json_malloc_t m = NULL;
    json_free_t f = NULL;
    json_get_alloc_funcs(&m, &f);
    if (m != counting_malloc || f != free) return 12;
    long before = counted;
    json_decref(json_string("counted"));
    if (counted <= before) return 13;
    fq_engine_free(e);
    return 0;
}

static json_t *free_twice_body(fq_op *op, void *ud) {
    (void)op;
    (void)ud;
    json_malloc_t m = NULL;
    json_free_t f = NULL;
    json_get_alloc_funcs(&m, &f);
    void *p = m(40), *q = m(40);
    f(p);
    f(q);
    f(p); /* p is the second of its class's kept blocks: stops the process */
    return NULL;
}

static int free_twice(void) {
    unsetenv("FETCHQ_JANSSON_CACHE");
    fq_engine *e = fq_engine_new(NULL, NULL, 0);
    if (!e || defaults()) return 11;
    if (on_a_worker(e, free_twice_body, NULL) != 0) return 12;
    return 13; /* not reached */
}

TEST(jansson_cache_installed_over_malloc_and_free) {
    char err[4096];
    int status = in_child(installs_and_mixes_with_malloc, err, sizeof err);
    CHECK(WIFEXITED(status));
    CHECK_EQ_INT(WEXITSTATUS(status), 0);
    if (err[0]) h_note("child's stderr: %s", err);
}

TEST(jansson_cache_off_with_FETCHQ_JANSSON_CACHE_0) {
    char err[4096];
    int status = in_child(off_with_the_environment_variable, err, sizeof err);
    CHECK(WIFEXITED(status));
    CHECK_EQ_INT(WEXITSTATUS(status), 0);
}

TEST(jansson_cache_leaves_another_allocator_alone) {
    char err[4096];
    int status = in_child(another_allocator_left_alone, err, sizeof err);
    CHECK(WIFEXITED(status));
    CHECK_EQ_INT(WEXITSTATUS(status), 0);
}

TEST(jansson_cache_double_free_stops_the_process) {
    char err[8192];
    int status = in_child(free_twice, err, sizeof err);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    CHECK_CONTAINS(err, "fetchq: a jansson value was freed twice");
}
