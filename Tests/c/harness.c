/* The runner of the fetchq C harness; see harness.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "harness.h"

#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define H_MAX_TESTS 512
#define H_MAX_PRINTED_FAILURES 40
#define H_KILL_GRACE_S 10

typedef struct {
    const char *name;
    h_test_fn fn;
    const char *file;
    int line;
    int timeout_s;
} h_test;

static h_test h_tests[H_MAX_TESTS];
static int h_ntests;

static const char *h_current = "?";
static atomic_int h_fail_count;
static bool h_forked = true;
static pthread_t h_main_thread;
static jmp_buf h_jump;
static char h_timeout_msg[256];
static size_t h_timeout_len;

void h_register(const char *name, h_test_fn fn, const char *file, int line,
                int timeout_s) {
    if (h_ntests >= H_MAX_TESTS) {
        fprintf(stderr, "harness: too many tests (max %d)\n", H_MAX_TESTS);
        exit(2);
    }
    h_tests[h_ntests++] = (h_test){name, fn, file, line, timeout_s};
}

static void h_report(const char *file, int line, const char *msg) {
    int n = atomic_fetch_add(&h_fail_count, 1) + 1;
    if (n <= H_MAX_PRINTED_FAILURES) {
        fprintf(stdout, "    %s: %s:%d: %s\n", h_current, file, line, msg);
        fflush(stdout);
    } else if (n == H_MAX_PRINTED_FAILURES + 1) {
        fprintf(stdout, "    %s: (further failures not printed)\n", h_current);
        fflush(stdout);
    }
}

void h_failf(const char *file, int line, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    h_report(file, line, buf);
}

void h_note(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stdout, "    %s: note: %s\n", h_current, buf);
    fflush(stdout);
}

bool h_check(bool ok, const char *file, int line, const char *expr) {
    if (!ok) h_failf(file, line, "CHECK(%s) failed", expr);
    return ok;
}

bool h_check_int(long long a, long long b, const char *file, int line,
                 const char *ea, const char *eb) {
    if (a == b) return true;
    h_failf(file, line, "CHECK_EQ_INT(%s, %s): %lld != %lld", ea, eb, a, b);
    return false;
}

bool h_check_str(const char *a, const char *b, const char *file, int line,
                 const char *ea, const char *eb) {
    bool ok = (a == NULL || b == NULL) ? a == b : strcmp(a, b) == 0;
    if (!ok)
        h_failf(file, line, "CHECK_STR(%s, %s): \"%s\" != \"%s\"", ea, eb,
                a ? a : "(null)", b ? b : "(null)");
    return ok;
}

bool h_check_contains(const char *s, const char *sub, const char *file,
                      int line, const char *es, const char *esub) {
    bool ok = s != NULL && sub != NULL && strstr(s, sub) != NULL;
    if (!ok)
        h_failf(file, line, "CHECK_CONTAINS(%s, %s): \"%s\" does not contain \"%s\"",
                es, esub, s ? s : "(null)", sub ? sub : "(null)");
    return ok;
}

int h_failures(void) { return atomic_load(&h_fail_count); }

void h_abort_test(void) {
    fflush(stdout);
    fflush(stderr);
    if (h_forked) _exit(1);
    if (pthread_equal(pthread_self(), h_main_thread)) longjmp(h_jump, 1);
    fprintf(stdout, "    %s: REQUIRE failed on a helper thread; aborting the run\n",
            h_current);
    fflush(stdout);
    abort();
}

int h_scaled_ms(int ms) {
    static int scale = 0;
    if (scale == 0) {
        const char *s = getenv("FQ_TEST_TIMEOUT_SCALE");
        scale = (s && atoi(s) > 0) ? atoi(s) : 1;
    }
    long long v = (long long)ms * scale;
    return v > 2000000000LL ? 2000000000 : (int)v;
}

static void h_on_alarm(int sig) {
    (void)sig;
    ssize_t w = write(STDOUT_FILENO, h_timeout_msg, h_timeout_len);
    (void)w;
    _exit(124);
}

static long long h_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int h_cmp(const void *a, const void *b) {
    const h_test *x = a, *y = b;
    int c = strcmp(x->file, y->file);
    return c ? c : x->line - y->line;
}

/* Runs t in this process; returns the number of failures (or -1 if a REQUIRE
 * ended it). */
static int h_run_here(const h_test *t) {
    h_current = t->name;
    atomic_store(&h_fail_count, 0);
    int secs = h_scaled_ms(t->timeout_s * 1000) / 1000;
    h_timeout_len = (size_t)snprintf(
        h_timeout_msg, sizeof h_timeout_msg,
        "    %s: TIMEOUT: still running after %d s (deadlock or hang)\n", t->name,
        secs);
    signal(SIGALRM, h_on_alarm);
    alarm((unsigned)secs);
    if (setjmp(h_jump) == 0) {
        t->fn();
    } else {
        alarm(0);
        return atomic_load(&h_fail_count) > 0 ? atomic_load(&h_fail_count) : 1;
    }
    alarm(0);
    int n = atomic_load(&h_fail_count);
    if (n > H_MAX_PRINTED_FAILURES)
        fprintf(stdout, "    %s: %d failures in all\n", t->name, n);
    return n;
}

/* Returns true if the test passed; writes a reason for a failure. */
static bool h_run_forked(const h_test *t, char *why, size_t whylen) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, whylen, "fork failed: %s", strerror(errno));
        return false;
    }
    if (pid == 0) {
        setvbuf(stdout, NULL, _IOLBF, 0);
        int n = h_run_here(t);
        fflush(stdout);
        fflush(stderr);
        _exit(n == 0 ? 0 : 1);
    }
    long long deadline =
        h_now_ms() + (long long)h_scaled_ms(t->timeout_s * 1000) + H_KILL_GRACE_S * 1000;
    int status = 0;
    bool killed = false;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) {
            snprintf(why, whylen, "waitpid failed: %s", strerror(errno));
            return false;
        }
        if (!killed && h_now_ms() > deadline) {
            kill(pid, SIGKILL);
            killed = true;
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (killed) {
        snprintf(why, whylen, "killed: did not end %d s after its timeout",
                 H_KILL_GRACE_S);
        return false;
    }
    if (WIFEXITED(status)) {
        int code = WEXITSTATUS(status);
        if (code == 0) return true;
        if (code == 124)
            snprintf(why, whylen, "timeout after %d s", t->timeout_s);
        else
            snprintf(why, whylen, "checks failed");
        return false;
    }
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        snprintf(why, whylen, "crashed: signal %d (%s)", sig, strsignal(sig));
        return false;
    }
    snprintf(why, whylen, "unknown wait status %d", status);
    return false;
}

int main(int argc, char **argv) {
    bool list = false;
    int first_pattern = argc;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-l") == 0) {
            list = true;
        } else if (strcmp(argv[i], "-n") == 0) {
            h_forked = false;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: %s [-l] [-n] [pattern...]\n", argv[0]);
            return 0;
        } else {
            first_pattern = i;
            break;
        }
    }
    qsort(h_tests, (size_t)h_ntests, sizeof h_tests[0], h_cmp);
    h_main_thread = pthread_self();
    setvbuf(stdout, NULL, _IOLBF, 0);

    int passed = 0, failed = 0, matched_patterns = 0;
    for (int k = 0; k < h_ntests; k++) {
        const h_test *t = &h_tests[k];
        if (first_pattern < argc) {
            bool match = false;
            for (int i = first_pattern; i < argc; i++)
                if (fnmatch(argv[i], t->name, 0) == 0) match = true;
            if (!match) continue;
        }
        matched_patterns++;
        if (list) {
            printf("%s\n", t->name);
            continue;
        }
        long long t0 = h_now_ms();
        char why[256] = "";
        bool ok;
        if (h_forked) {
            ok = h_run_forked(t, why, sizeof why);
        } else {
            int n = h_run_here(t);
            ok = n == 0;
            if (!ok) snprintf(why, sizeof why, "checks failed");
        }
        long long dt = h_now_ms() - t0;
        if (ok) {
            passed++;
            printf("PASS %s (%lld ms)\n", t->name, dt);
        } else {
            failed++;
            printf("FAIL %s (%lld ms): %s\n", t->name, dt, why);
        }
        fflush(stdout);
    }
    if (list) return 0;
    if (matched_patterns == 0 && first_pattern < argc) {
        printf("no test matches the given names\n");
        failed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
