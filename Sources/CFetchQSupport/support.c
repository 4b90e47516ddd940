#define _GNU_SOURCE
#include "fq_support.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>

/* The last error message of each thread. A pthread key owns the buffer so
 * that it is freed when its thread exits (a plain _Thread_local pointer
 * leaked it). The buffer grows to fit: messages are never truncated. */
struct last_error {
    char *text;
    size_t cap;
    int status;
};

static pthread_key_t last_error_key;
static pthread_once_t last_error_once = PTHREAD_ONCE_INIT;

static void free_last_error(void *p) {
    struct last_error *e = p;
    free(e->text);
    free(e);
}

/* 0 when the process had no key left (PTHREAD_KEYS_MAX): no message is kept
 * then, rather than writing through key 0, which is someone else's. */
static int last_error_key_made;

static void make_key(void) { last_error_key_made = pthread_key_create(&last_error_key, free_last_error) == 0; }

static struct last_error *this_thread(int create) {
    pthread_once(&last_error_once, make_key);
    if (!last_error_key_made) return NULL;
    struct last_error *e = pthread_getspecific(last_error_key);
    if (e == NULL && create) {
        e = calloc(1, sizeof *e);
        if (e != NULL && pthread_setspecific(last_error_key, e) != 0) {
            free(e);
            e = NULL;
        }
    }
    return e;
}

static _Thread_local const void *current_engine;

void fqs_set_last_error(int status, const char *message) {
    size_t n = message ? strlen(message) : 0;
    struct last_error *e = this_thread(1);
    if (e == NULL) return;
    e->status = status;
    if (n + 1 > e->cap) {
        char *grown = realloc(e->text, n + 1);
        if (grown == NULL) return; /* keep the previous message */
        e->text = grown;
        e->cap = n + 1;
    }
    if (n) memcpy(e->text, message, n);
    e->text[n] = '\0';
}

const char *fqs_last_error(void) {
    struct last_error *e = this_thread(0);
    return e && e->text ? e->text : "";
}

int fqs_last_status(void) {
    struct last_error *e = this_thread(0);
    return e ? e->status : 0;
}

void fqs_set_current_engine(const void *engine) { current_engine = engine; }

const void *fqs_current_engine(void) { return current_engine; }

static _Thread_local void *current_release_list;

void fqs_set_current_release_list(void *list) { current_release_list = list; }

void *fqs_current_release_list(void) { return current_release_list; }

int fqs_eventfd(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

static int start_thread(pthread_t *thread, void *(*start)(void *), void *arg) {
    pthread_attr_t attr;
    size_t size = 0;
    if (pthread_getattr_default_np(&attr) != 0 && pthread_attr_init(&attr) != 0)
        return pthread_create(thread, NULL, start, arg);
    if (pthread_attr_getstacksize(&attr, &size) != 0 || size < FQS_THREAD_STACK)
        pthread_attr_setstacksize(&attr, FQS_THREAD_STACK);
    int rc = pthread_create(thread, &attr, start, arg);
    pthread_attr_destroy(&attr);
    return rc;
}

int fqs_start_thread(void *thread, void *(*start)(void *), void *arg) {
    return start_thread((pthread_t *)thread, start, arg);
}

/* The new thread inherits the creating thread's mask: it is set here around
 * pthread_create. Synchronous signals stay deliverable (blocked, a fault's
 * signal would kill the process past the host's handler). */
int fqs_start_thread_masked(void *thread, void *(*start)(void *), void *arg) {
    sigset_t blocked, previous;
    sigfillset(&blocked);
    static const int synchronous[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};
    for (size_t i = 0; i < sizeof synchronous / sizeof *synchronous; i++) sigdelset(&blocked, synchronous[i]);
    pthread_sigmask(SIG_SETMASK, &blocked, &previous);
    int rc = start_thread((pthread_t *)thread, start, arg);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    return rc;
}

unsigned fqs_xfsz_hold(void) {
    sigset_t one, old, pending;
    sigemptyset(&one);
    sigaddset(&one, SIGXFSZ);
    if (pthread_sigmask(SIG_BLOCK, &one, &old) != 0) return 0;
    if (sigismember(&old, SIGXFSZ)) return 1; /* held already: nothing to undo */
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ)) return 2; /* not ours: left */
    return 3;
}

void fqs_xfsz_release(unsigned token) {
    if (token < 2) return;
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, SIGXFSZ);
    if (token == 3) {
        sigset_t pending;
        if (sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ)) {
            struct timespec zero = {0, 0};
            sigtimedwait(&one, NULL, &zero); /* raised by a write of ours: taken, not delivered */
        }
    }
    pthread_sigmask(SIG_UNBLOCK, &one, NULL);
}

void fqs_set_thread_name(const char *name) {
    char shortened[16];
    strncpy(shortened, name, sizeof shortened - 1);
    shortened[sizeof shortened - 1] = '\0';
    pthread_setname_np(pthread_self(), shortened);
}
