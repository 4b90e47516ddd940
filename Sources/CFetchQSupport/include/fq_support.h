/* Internal helpers for the Swift engine; not part of the public ABI
 * (the export map hides them). */
#ifndef FQ_SUPPORT_H
#define FQ_SUPPORT_H

#include <stddef.h>

/* The calling thread's last error: its status and message (what
 * fq_last_status() and fq_last_error() return). */
void fqs_set_last_error(int status, const char *message);
const char *fqs_last_error(void);
int fqs_last_status(void);

/* Which engine, if any, the calling thread is working for (a worker, the
 * delivery thread, or a thread inside fq_engine_dispatch). Used to refuse
 * calls that would wait for themselves. */
void fqs_set_current_engine(const void *engine);
const void *fqs_current_engine(void);

/* The calling worker thread's release list (see ReleaseList.swift); NULL on
 * other threads. */
void fqs_set_current_release_list(void *list);
void *fqs_current_release_list(void);

/* eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); -1 with errno on failure. */
int fqs_eventfd(void);

/* Names the calling thread (at most 15 bytes are kept, as Linux allows). */
void fqs_set_thread_name(const char *name);

/* Starts an engine thread (pthread_create) with a stack of at least
 * FQS_THREAD_STACK bytes, whatever default stack size the host process set
 * (ulimit -s, pthread_setattr_default_np): bodies, callbacks and jansson's
 * recursive json_delete of a 2048-deep value run there. A larger default is
 * kept. The thread starts with the creating thread's signal mask (bodies,
 * callbacks and the processes they start inherit it). Returns
 * pthread_create's result. */
#define FQS_THREAD_STACK (8u << 20)
int fqs_start_thread(void *thread, void *(*start)(void *), void *arg);
/* The same with every signal blocked but the synchronous ones (SIGSEGV,
 * SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT): for a transfer thread,
 * where the process's signals must not land and a write into a closed socket
 * fails with EPIPE. */
int fqs_start_thread_masked(void *thread, void *(*start)(void *), void *arg);

/* SIGXFSZ held on the calling thread around a file write of the library's
 * own (the cache file, the item store): a write past RLIMIT_FSIZE then fails
 * with EFBIG (an I/O error of SQLite's) instead of ending the process by the
 * signal's default action, and the signal it raised is taken, not delivered.
 * fqs_xfsz_release(token) undoes fqs_xfsz_hold() (nothing when SIGXFSZ was
 * blocked already; a SIGXFSZ pending before is left pending). */
unsigned fqs_xfsz_hold(void);
void fqs_xfsz_release(unsigned token);

/* jansson's allocation functions with a per-thread cache of small freed
 * blocks (jansson_cache.c). They hand out and take back plain malloc blocks,
 * so they mix with malloc/free either way. Only threads that turned it on
 * (the engine's) keep blocks: at most FQS_JC_MAX_BYTES of blocks of up to
 * FQS_JC_CLASSES * 16 + 8 usable bytes, freed when the thread exits; all
 * threads together at most FQS_JC_PROCESS_MAX_BYTES. */
#define FQS_JC_CLASSES 16
#define FQS_JC_MAX_BYTES 4194304 /* 4 MiB */
#define FQS_JC_PROCESS_MAX_BYTES 67108864 /* 64 MiB */
void *fqs_jc_malloc(size_t n);
void fqs_jc_free(void *p);
/* Installs them with json_set_alloc_funcs if jansson still uses malloc and
 * free (or already uses them): 1; 0 when another allocator is set (left as
 * it is). */
int fqs_jansson_cache_install(void);
int fqs_jansson_cache_installed(void);
/* Turns keeping blocks on (1) or off (0, which frees them) for the calling
 * thread; the engine's threads turn it on when they start. */
void fqs_jansson_cache_thread_enable(int on);
/* Whether the environment variable FETCHQ_JANSSON_CACHE (its value, or NULL
 * when unset) asks for the cache: anything but "0". */
int fqs_jansson_cache_wanted(const char *env);
/* Usable bytes on the calling thread's lists; bytes that threads' exits
 * freed from theirs so far. */
size_t fqs_jansson_cache_thread_bytes(void);
size_t fqs_jansson_cache_exit_drained_bytes(void);
/* The room the calling thread holds for its lists, and all threads
 * together (taken from FQS_JC_PROCESS_MAX_BYTES in grants of 256 KiB). */
size_t fqs_jansson_cache_thread_granted(void);
size_t fqs_jansson_cache_granted_bytes(void);
/* malloc_usable_size(p), for the tests. */
size_t fqs_usable_size(void *p);
/* Frees the calling thread's lists now. */
void fqs_jansson_cache_drain_thread(void);

#endif
