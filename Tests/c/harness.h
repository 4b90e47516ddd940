/*
 * A tiny test framework for the fetchq C harness.
 *
 *   TEST(name) { ... }            registers a test (timeout 60 s)
 *   TEST_T(name, seconds) { ... } registers a test with its own timeout
 *
 *   CHECK(cond)            records a failure (file:line, the expression) and
 *                          goes on; evaluates to the truth of cond
 *   CHECK_EQ_INT(a, b)     integers compared as long long, both values shown
 *   CHECK_STR(a, b)        C strings (NULL-safe), both values shown
 *   CHECK_CONTAINS(s, sub) s is not NULL and contains sub
 *   REQUIRE(cond)          like CHECK, but ends the test at once on failure
 *   FAILF(fmt, ...)        records a failure with a message
 *
 * Every check may be used from any thread (callbacks, bodies, helpers).
 *
 * The runner (harness.c) runs each test in a child process (fork) so that a
 * crash or a deadlock fails that test only: the child arms alarm() with the
 * test's timeout and the parent kills it if it outlives that by 10 s. It
 * prints one line per test and ends with exactly "N passed, N failed"; the
 * exit status is non-zero if any test failed.
 *
 * Usage: c_harness [-l] [-n] [pattern...]
 *   pattern   run only the tests whose name matches (fnmatch, e.g. 'cancel_*')
 *   -l        list the tests and exit
 *   -n        no fork: run in-process (for gdb); a timeout then ends the run
 * Environment: FQ_TEST_TIMEOUT_SCALE=k multiplies every timeout (valgrind).
 */
#ifndef FQ_HARNESS_H
#define FQ_HARNESS_H

#include <stdbool.h>
#include <stddef.h>

typedef void (*h_test_fn)(void);

void h_register(const char *name, h_test_fn fn, const char *file, int line,
                int timeout_s);

/* All return `ok` so that checks can be used as conditions. */
bool h_check(bool ok, const char *file, int line, const char *expr);
bool h_check_int(long long a, long long b, const char *file, int line,
                 const char *ea, const char *eb);
bool h_check_str(const char *a, const char *b, const char *file, int line,
                 const char *ea, const char *eb);
bool h_check_contains(const char *s, const char *sub, const char *file,
                      int line, const char *es, const char *esub);
void h_failf(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Ends the current test now (the failure is already recorded). */
void h_abort_test(void) __attribute__((noreturn));
/* Number of failures recorded so far in the current test. */
int h_failures(void);
/* Prints a note under the current test (not a failure). */
void h_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* FQ_TEST_TIMEOUT_SCALE applied to a duration in milliseconds. */
int h_scaled_ms(int ms);

#define TEST_T(name, seconds)                                               \
    static void name(void);                                                 \
    __attribute__((constructor)) static void h_register_##name(void) {      \
        h_register(#name, name, __FILE__, __LINE__, (seconds));             \
    }                                                                       \
    static void name(void)

#define TEST(name) TEST_T(name, 60)

#define CHECK(cond) h_check(!!(cond), __FILE__, __LINE__, #cond)
#define CHECK_EQ_INT(a, b)                                                  \
    h_check_int((long long)(a), (long long)(b), __FILE__, __LINE__, #a, #b)
#define CHECK_STR(a, b) h_check_str((a), (b), __FILE__, __LINE__, #a, #b)
#define CHECK_CONTAINS(s, sub)                                              \
    h_check_contains((s), (sub), __FILE__, __LINE__, #s, #sub)
#define FAILF(...) h_failf(__FILE__, __LINE__, __VA_ARGS__)
#define REQUIRE(cond)                                                       \
    do {                                                                    \
        if (!h_check(!!(cond), __FILE__, __LINE__, #cond)) h_abort_test();  \
    } while (0)

#endif
