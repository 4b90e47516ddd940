/* jansson's allocator as fetchq.h describes it ("jansson's allocation
 * functions"): the first engine sets fetchq's caching functions only over
 * jansson's own malloc/free, not with FETCHQ_JANSSON_CACHE=0 and not over
 * another allocator; the blocks stay malloc blocks (a json_dumps string may
 * be free()d), on the application's threads and on the engine's (which keep
 * freed blocks); a block freed again soon after on the same engine thread
 * stops the process with a message; all the engine's threads together keep
 * at most 64 MiB of blocks. Each case runs in a child of its own (the setting is process-wide
 * and the harness may run tests in one process), which starts from jansson's
 * defaults. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
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

/* Runs fn in a child (in_child) and checks that it exited with status 0,
 * noting its standard error, if any. */
static void child_succeeds(int (*fn)(void)) {
    char err[4096];
    int status = in_child(fn, err, sizeof err);
    CHECK(WIFEXITED(status));
    CHECK_EQ_INT(WEXITSTATUS(status), 0);
    if (err[0]) h_note("child's stderr: %s", err);
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

/* Sizes no block can have: NULL, as from malloc (the class of a request
 * within 7 bytes of SIZE_MAX wrapped to the smallest: a 24-byte block, on an
 * engine thread: the tenth review). 0, or the size's distance from SIZE_MAX
 * plus one. (Not run under ASan or valgrind, which stop at such a malloc.) */
static int refuse_huge_sizes(void) {
    json_malloc_t m = NULL;
    json_free_t f = NULL;
    json_get_alloc_funcs(&m, &f);
    for (size_t over = 0; over < 8; over++) {
        void *huge = m(SIZE_MAX - over);
        if (huge != NULL) return (int)over + 1;
    }
    return 0;
}

static json_t *refuse_huge_sizes_body(fq_op *op, void *ud) {
    (void)op;
    *(int *)ud = refuse_huge_sizes();
    return NULL;
}

static int huge_sizes_refused(void) {
    unsetenv("FETCHQ_JANSSON_CACHE");
    fq_engine *e = fq_engine_new(NULL, NULL, 0);
    if (!e || defaults()) return 11;
    if (refuse_huge_sizes() != 0) return 12; /* an application thread */
    int worker_rc = -1;
    if (on_a_worker(e, refuse_huge_sizes_body, &worker_rc) != 0) return 13;
    if (worker_rc != 0) return 20 + worker_rc; /* an engine thread, which keeps blocks */
    return fq_engine_free(e) == FQ_OK ? 0 : 14;
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

TEST(jansson_cache_installed_over_malloc_and_free) { child_succeeds(installs_and_mixes_with_malloc); }

TEST(jansson_cache_refuses_sizes_no_block_can_have) { child_succeeds(huge_sizes_refused); }

TEST(jansson_cache_off_with_FETCHQ_JANSSON_CACHE_0) { child_succeeds(off_with_the_environment_variable); }

TEST(jansson_cache_leaves_another_allocator_alone) { child_succeeds(another_allocator_left_alone); }

TEST(jansson_cache_double_free_stops_the_process) {
    char err[8192];
    int status = in_child(free_twice, err, sizeof err);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    CHECK_CONTAINS(err, "fetchq: a jansson value was freed twice");
}

/* ---- all threads together keep at most 64 MiB (fetchq.h) ------------------ */

enum { FILL_WORKERS = 20 };
#define MIB (1024.0 * 1024.0)

static pthread_mutex_t fill_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fill_cond = PTHREAD_COND_INITIALIZER;
static int fill_made; /* bodies holding their values */

static int fill_target = FILL_WORKERS; /* bodies that must hold their values at once */
static int fill_values = 17000;        /* values each body makes */

/* Makes about 4.3 MiB of small jansson values (a 200-character string is a
 * 216-byte block and a 40-byte one), waits until every body holds its own
 * (so each runs on a worker of its own), then frees them there: the worker
 * keeps the blocks, up to what the bounds allow. *ud: 0, or what failed. */
static json_t *fill_body(fq_op *op, void *ud) {
    (void)op;
    char text[201];
    memset(text, 'x', 200);
    text[200] = '\0';
    json_t *all = json_array();
    for (int i = 0; i < fill_values && all; i++)
        if (json_array_append_new(all, json_string(text)) != 0) *(int *)ud = 1;
    if (!all) *(int *)ud = 2;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    pthread_mutex_lock(&fill_lock);
    fill_made++;
    pthread_cond_broadcast(&fill_cond);
    while (fill_made < fill_target)
        if (pthread_cond_timedwait(&fill_cond, &fill_lock, &until) != 0) {
            *(int *)ud = 3; /* the bodies did not all run at once */
            break;
        }
    pthread_mutex_unlock(&fill_lock);
    json_decref(all);
    return NULL;
}

/* Bytes the allocator has handed out and not got back: AddressSanitizer's
 * own count, or glibc's (mallinfo2); -1 where neither counts (valgrind's
 * allocator), and there the tests check the engine's own count only. */
extern size_t __sanitizer_get_current_allocated_bytes(void) __attribute__((weak));
static double heap_in_use(void) {
    if (__sanitizer_get_current_allocated_bytes) return (double)__sanitizer_get_current_allocated_bytes();
    malloc_trim(0);
    size_t used = mallinfo2().uordblks;
    return used > 0 ? (double)used : -1;
}

/* stats["jansson_cache"][key] (the whole process's), or -1. */
static long long cache_stat(fq_engine *e, const char *key) {
    json_t *s = fq_engine_stats(e);
    long long v = fqt_int(json_object_get(s, "jansson_cache"), key, -1);
    json_decref(s);
    return v;
}

/* Runs `bodies` fill bodies at once on an engine with as many workers, each
 * making `values` values, then checks what the process keeps: the engine's
 * count (stats) is `room` exactly, and the heap in use grew by about that
 * much, where the allocator counts it. The bounds count a block as its
 * usable size: a value's two blocks (216 and 40 bytes) count 256 bytes and
 * take 256 (ASan) to 272 (glibc) bytes of the heap. After fq_engine_free both
 * are back where they were. Exit codes: 0 ok, 10+ a step that went wrong. */
static int fill_and_check(int bodies, int values, double room) {
    unsetenv("FETCHQ_JANSSON_CACHE");
    fill_target = bodies;
    fill_values = values;
    double before = heap_in_use();
    json_t *config = json_pack("{s:i}", "workers", bodies);
    fq_engine *e = fq_engine_new(config, NULL, 0);
    json_decref(config);
    if (!e || defaults()) return 11;
    if (cache_stat(e, "bytes") != 0 || cache_stat(e, "limit") != 64 * 1024 * 1024) return 12;
    fq_queue *q = fq_queue_new(e, "fill", bodies);
    if (!q) return 13;
    int rc[FILL_WORKERS] = {0};
    for (int i = 0; i < bodies; i++)
        if (fq_submit_block(q, fill_body, NULL, NULL, &rc[i]) <= 0) return 14;
    if (fq_queue_wait(q, 60000) != FQ_OK) return 15;
    for (int i = 0; i < bodies; i++)
        if (rc[i] != 0) return 20 + rc[i];
    long long counted = cache_stat(e, "bytes");
    fprintf(stderr, "the engine counts %.2f MiB kept\n", (double)counted / MIB);
    if (counted != (long long)room) return 30;
    if (before >= 0) {
        double kept = heap_in_use() - before;
        fprintf(stderr, "the heap keeps %.2f MiB\n", kept / MIB);
        if (kept > room * 272.0 / 256.0 + 1 * MIB) return 31; /* and 1 MiB for the engine itself */
        if (kept < room - 2 * MIB) return 32;                 /* blocks are kept, up to the bound */
    } else {
        fprintf(stderr, "this allocator does not count its heap: the engine's count only\n");
    }
    if (fq_engine_free(e) != FQ_OK) return 33;
    if (before >= 0 && heap_in_use() - before > 2 * MIB) return 34;
    fq_engine *again = fq_engine_new(NULL, NULL, 0);
    if (!again || cache_stat(again, "bytes") != 0) return 35; /* the threads gave their room back */
    fq_engine_free(again);
    return 0;
}

/* One worker frees about 8.6 MiB of blocks and keeps 4 MiB of them. */
static int bounded_per_thread(void) { return fill_and_check(1, 34000, 4 * MIB); }

/* 20 workers free about 86 MiB of blocks, 4.3 MiB each: they keep 64 MiB
 * together (4 MiB each would be 80 MiB). */
static int bounded_across_threads(void) { return fill_and_check(FILL_WORKERS, 17000, 64 * MIB); }

TEST(jansson_cache_bounded_per_thread) { child_succeeds(bounded_per_thread); }

TEST(jansson_cache_bounded_across_threads) { child_succeeds(bounded_across_threads); }
