#define _GNU_SOURCE
#include "fq_support.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <string.h>

/* Thread-local storage: Swift has no thread-local variables of its own.
 * The message buffer grows to fit (messages are never truncated); it is
 * reused for the life of the thread. */
static _Thread_local char *last_error;
static _Thread_local size_t last_error_cap;
static _Thread_local const void *current_engine;

void fqs_set_last_error(const char *message) {
    size_t n = message ? strlen(message) : 0;
    if (n + 1 > last_error_cap) {
        char *grown = realloc(last_error, n + 1);
        if (grown == NULL) return; /* keep the previous message */
        last_error = grown;
        last_error_cap = n + 1;
    }
    if (n) memcpy(last_error, message, n);
    last_error[n] = '\0';
}

const char *fqs_last_error(void) { return last_error ? last_error : ""; }

void fqs_set_current_engine(const void *engine) { current_engine = engine; }

const void *fqs_current_engine(void) { return current_engine; }

int fqs_eventfd(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

void fqs_set_thread_name(const char *name) {
    char shortened[16];
    strncpy(shortened, name, sizeof shortened - 1);
    shortened[sizeof shortened - 1] = '\0';
    pthread_setname_np(pthread_self(), shortened);
}
