/*
 * A per-thread cache of small freed blocks for jansson (see fq_support.h).
 *
 * Why: a parsed 3 KB document is about 680 jansson blocks, all freed at once
 * when its result goes. glibc's per-thread cache keeps 7 blocks of a size, so
 * the rest go to the arena's fast bins, and every request of 1 KiB or more
 * (libcurl allocates its 16 KiB receive buffer for each transfer) merges the
 * fast bins back into the arena: the next document's blocks then come from
 * the slow path. In P2, malloc and free were half of all instructions
 * (bench/findings.md, "Seventeenth round").
 *
 * What: jansson's allocation functions, set with json_set_alloc_funcs. They
 * hand out and take back ordinary malloc blocks, so they mix with plain
 * malloc/free in every direction: a block they return may be free()d, a
 * block from malloc may come to them, and a string from json_dumps may be
 * free()d as jansson's documentation says. A freed block of up to
 * FQS_JC_CLASSES * 16 + 8 usable bytes (malloc_usable_size), freed on one of
 * the engine's threads (fqs_jansson_cache_thread_enable), goes on that
 * thread's list for its size class while the thread holds less than
 * FQS_JC_MAX_BYTES; a request on such a thread takes from its list of the
 * class first. On every other thread they are malloc and free. A thread's
 * blocks are freed when it exits (the engine's threads exit when it is
 * freed).
 *
 * All threads together keep at most FQS_JC_PROCESS_MAX_BYTES: a thread
 * takes room for its lists from that budget in grants of JC_GRANT bytes
 * (one atomic operation per grant, not per block) and gives a grant back
 * when its lists have shrunk two grants below what it holds, or when it
 * exits. A free that finds no room goes to free(). So an engine with many
 * workers, or many engines, cannot keep 4 MiB on each of their threads.
 */
#define _GNU_SOURCE
#include "fq_support.h"

#include <jansson.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A kept block: the list link. */
struct jc_block {
    struct jc_block *next;
};

/* How many of a class's most recently kept blocks a free compares with,
 * to find a block freed twice (as glibc checks its fast bins' top). Only
 * pointers are compared: the freed block's own bytes may never have been
 * written, and branching on them would be reading uninitialised memory. */
#define JC_DOUBLE_FREE_SCAN 4

struct jc_thread {
    struct jc_block *head[FQS_JC_CLASSES + 1]; /* class k: usable size 16k + 8 .. 16k + 23 */
    size_t bytes;                              /* the lists' blocks, each as its class's size */
    size_t granted;                            /* room taken from the process's budget: bytes <= granted */
    int state;                                 /* 0: not caching, 1: caching, 2: exited */
};

/* The process's budget is handed out in grants of this many bytes. */
#define JC_GRANT ((size_t)262144) /* 256 KiB */
_Static_assert(FQS_JC_MAX_BYTES % JC_GRANT == 0 && FQS_JC_PROCESS_MAX_BYTES % JC_GRANT == 0,
               "the bounds are whole grants");

static __thread struct jc_thread jc;
static pthread_key_t jc_exit_key;
static pthread_once_t jc_once = PTHREAD_ONCE_INIT;
/* Bytes freed by threads' exits (for the tests): written only then. */
static atomic_size_t jc_exit_drained;
/* The grants all threads hold, at most FQS_JC_PROCESS_MAX_BYTES. */
static atomic_size_t jc_granted_total;

/* One more grant for t, if its own bound and the process's allow it. */
static int jc_take_grant(struct jc_thread *t) {
    if (t->granted + JC_GRANT > FQS_JC_MAX_BYTES) return 0;
    size_t total = atomic_load_explicit(&jc_granted_total, memory_order_relaxed);
    do {
        if (total + JC_GRANT > FQS_JC_PROCESS_MAX_BYTES) return 0;
    } while (!atomic_compare_exchange_weak_explicit(&jc_granted_total, &total, total + JC_GRANT,
                                                    memory_order_relaxed, memory_order_relaxed));
    t->granted += JC_GRANT;
    return 1;
}

static void jc_give_back(struct jc_thread *t, size_t n) {
    t->granted -= n;
    atomic_fetch_sub_explicit(&jc_granted_total, n, memory_order_relaxed);
}

static void jc_drain(struct jc_thread *t) {
    for (int k = 1; k <= FQS_JC_CLASSES; k++) {
        struct jc_block *b = t->head[k];
        while (b != NULL) {
            struct jc_block *next = b->next;
            free(b);
            b = next;
        }
        t->head[k] = NULL;
    }
    t->bytes = 0;
    jc_give_back(t, t->granted);
}

/* At thread exit: free the lists; from here on this thread frees directly
 * (other destructors may still free jansson values). */
static void jc_thread_exit(void *unused) {
    (void)unused;
    atomic_fetch_add_explicit(&jc_exit_drained, jc.bytes, memory_order_relaxed);
    jc_drain(&jc);
    jc.state = 2;
}

/* 0 when the process had no key left: no thread keeps blocks then (they
 * could not be freed at its exit). */
static int jc_key_made;

static void jc_init(void) { jc_key_made = pthread_key_create(&jc_exit_key, jc_thread_exit) == 0; }

/* The class that serves a request of n bytes: the least k with 16k + 8 >= n
 * (written so that it cannot wrap: (n - 8 + 15) / 16 made a request within
 * 7 bytes of SIZE_MAX class 0, a 24-byte block: the tenth review). */
static inline size_t jc_class_for_request(size_t n) { return n <= 24 ? 1 : (n - 8) / 16 + ((n - 8) % 16 != 0); }

/* The size a block of class k is allocated with and counted as. */
static inline size_t jc_class_size(size_t k) { return 16 * k + 8; }

void *fqs_jc_malloc(size_t n) {
    size_t k = jc_class_for_request(n);
    struct jc_thread *t = &jc;
    if (k > FQS_JC_CLASSES || t->state != 1) return malloc(n);
    struct jc_block *b = t->head[k];
    if (b != NULL) {
        t->head[k] = b->next;
        t->bytes -= jc_class_size(k);
        if (t->granted - t->bytes >= 2 * JC_GRANT) jc_give_back(t, JC_GRANT);
        return b;
    }
    /* The class's exact size: freed, it comes back to this class. */
    return malloc(jc_class_size(k));
}

void fqs_jc_free(void *p) {
    if (p == NULL) return;
    struct jc_thread *t = &jc;
    if (t->state != 1) { /* a thread that keeps nothing: no size to look up */
        free(p);
        return;
    }
    size_t usable = malloc_usable_size(p);
    size_t k = usable < 24 ? 0 : (usable - 8) / 16;
    if (k == 0 || k > FQS_JC_CLASSES || (t->bytes + jc_class_size(k) > t->granted && !jc_take_grant(t))) {
        free(p);
        return;
    }
    struct jc_block *b = p;
    struct jc_block *c = t->head[k];
    for (int i = 0; i < JC_DOUBLE_FREE_SCAN && c != NULL; i++, c = c->next) {
        if (c == b) {
            fprintf(stderr, "fetchq: a jansson value was freed twice (block %p)\n", p);
            abort();
        }
    }
    b->next = t->head[k];
    t->head[k] = b;
    t->bytes += jc_class_size(k);
}

void fqs_jansson_cache_thread_enable(int on) {
    pthread_once(&jc_once, jc_init);
    struct jc_thread *t = &jc;
    if (on && t->state == 0 && jc_key_made) {
        /* have the lists freed when the thread exits */
        pthread_setspecific(jc_exit_key, t);
        t->state = 1;
    } else if (!on && t->state == 1) {
        jc_drain(t);
        pthread_setspecific(jc_exit_key, NULL);
        t->state = 0;
    }
}

int fqs_jansson_cache_install(void) {
    pthread_once(&jc_once, jc_init);
    json_malloc_t m = NULL;
    json_free_t f = NULL;
    json_get_alloc_funcs(&m, &f);
    if (m == fqs_jc_malloc && f == fqs_jc_free) return 1;
    if (m != malloc || f != free) return 0; /* someone else's allocator: leave it */
    json_set_alloc_funcs(fqs_jc_malloc, fqs_jc_free);
    return 1;
}

int fqs_jansson_cache_installed(void) {
    json_malloc_t m = NULL;
    json_free_t f = NULL;
    json_get_alloc_funcs(&m, &f);
    return m == fqs_jc_malloc && f == fqs_jc_free;
}

int fqs_jansson_cache_wanted(const char *env) {
    return env == NULL || strcmp(env, "0") != 0;
}

size_t fqs_jansson_cache_thread_bytes(void) { return jc.bytes; }

size_t fqs_jansson_cache_thread_granted(void) { return jc.granted; }

size_t fqs_jansson_cache_granted_bytes(void) {
    return atomic_load_explicit(&jc_granted_total, memory_order_relaxed);
}

size_t fqs_jansson_cache_exit_drained_bytes(void) {
    return atomic_load_explicit(&jc_exit_drained, memory_order_relaxed);
}

void fqs_jansson_cache_drain_thread(void) { jc_drain(&jc); }

size_t fqs_usable_size(void *p) { return malloc_usable_size(p); }

/* At process exit (the library is linked -z nodelete, so dlclose leaves it
 * loaded: its thread-specific keys' destructors and jansson's allocator
 * pointers stay valid), jansson gets malloc and free back. The blocks on the
 * lists are plain malloc blocks; the calling thread's are freed. */
__attribute__((destructor)) static void jc_unload(void) {
    if (fqs_jansson_cache_installed()) json_set_alloc_funcs(malloc, free);
    jc_drain(&jc);
    jc.state = 2;
}
