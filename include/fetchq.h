/*
 * fetchq — an operation-queue engine for network fetch/parse work.
 *
 * This header is the whole C ABI of libfetchq. It is checked by the Swift
 * compiler against the implementation (`@c @implementation`), so what is
 * declared here is exactly what the library exports.
 *
 * Conventions (read once, they hold everywhere below):
 *
 *  - Handles are opaque and typed. Every `*_new` has a `*_free`;
 *    `*_free(NULL)` is a no-op.
 *  - Functions returning `int` return FQ_OK (0) or a negative `fq_status`.
 *    When a call fails, a message describing why is available from
 *    fq_last_error() on the same thread.
 *  - C strings (names, queries, URLs, groups, collections, ids, JSON
 *    Pointers) must be UTF-8: one that is not is refused (FQ_ERR_INVALID),
 *    never repaired. Only messages (fq_op_set_error, fq_op_finish) are taken
 *    as they are, with U+FFFD for bytes that are not UTF-8.
 *  - JSON crosses the boundary as jansson `json_t`. Every `json_t *` says
 *    whether it is BORROWED (the library keeps ownership; it says how long the
 *    pointer stays valid — json_incref() it to keep it longer), NEW (the
 *    caller owns the reference and must json_decref() it) or STOLEN (the
 *    library takes the caller's reference, also when the call fails).
 *    Input objects that are only read (config, options) are borrowed for the
 *    duration of the call; the library copies what it keeps.
 *  - jansson's allocator. The first fq_engine_new() sets jansson's
 *    allocation functions (json_set_alloc_funcs), process-wide, to fetchq's,
 *    if they are still jansson's defaults (malloc and free). Another
 *    allocator set before is left as it is, and FETCHQ_JANSSON_CACHE=0 in the
 *    environment leaves jansson's defaults. On each of the engine's own
 *    threads (transfer threads, workers, the delivery thread), fetchq's
 *    functions keep up to 4 MiB of freed jansson blocks of up to 264 bytes
 *    (all threads of the process together at most 64 MiB, whatever the
 *    number of workers and engines) and reuse them for the next values made
 *    there (a parsed response is hundreds of such blocks); the blocks are
 *    freed when the thread exits, at the latest in fq_engine_free(). On the application's threads they are
 *    malloc and free. The blocks are plain malloc blocks: free() still frees
 *    json_dumps()'s string, and a block from malloc may still be handed to
 *    jansson. A block freed again on the same engine thread before 4 more
 *    blocks of its size are freed there stops the process with a message;
 *    a later second free goes unnoticed. Memory checkers (ASan, valgrind) see a kept block as
 *    allocated: run them with FETCHQ_JANSSON_CACHE=0.
 *  - Signals. The transfer threads run with every signal blocked but the
 *    synchronous ones (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS,
 *    SIGABRT); the workers, the delivery thread and the timer have the mask
 *    of the thread that called fq_engine_new(), and bodies and callbacks,
 *    and processes they start, inherit the mask of the thread they run on
 *    (in "inline" mode a callback may run on a transfer thread: reset the
 *    mask of a process started there, e.g. posix_spawnattr_setsigmask()).
 *    The library's own writes to the cache file and the item store, on any
 *    thread (fq_engine_new() and fq_engine_free() with a cache file, the
 *    fq_store_* calls included), hold SIGXFSZ meanwhile: past RLIMIT_FSIZE
 *    such a write fails instead of ending the process (a cache write is
 *    skipped, a store write or an engine's cache file that cannot be set up
 *    is FQ_ERR_STORE).
 *  - dlclose() does not unload the library (it is linked -z nodelete): the
 *    allocation functions given to jansson and the destructors of its
 *    thread-specific data (fq_last_error's message) stay valid for threads
 *    and values that outlive the handle. A later dlopen() gets it again.
 *  - Configuration and options are JSON objects. An unknown key, a value of
 *    the wrong type (a real where an integer is expected included) or out of
 *    its range is an error (FQ_ERR_INVALID with a message); nothing is
 *    silently ignored. NULL means "no options". Ranges: max_wait_ms, aging_ms,
 *    timeout_ms 0..86400000; connect_timeout_ms 0..3600000; max_redirects
 *    0..100; max_response_bytes 1..2^40; max_json_depth 1..2048 (jansson's
 *    own limit, where a scalar inside 2048 containers is already too deep);
 *    progress_interval_ms 0..60000; retry max 0..100, base 0..3600 s,
 *    max_delay 0..86400 s; rate per_second 0.001..1e6, burst 1..1e6; cache
 *    max_bytes 0..2^40; workers 1..256; history 0..1000000; max_per_host
 *    1..1024.
 *  - Accessors given a NULL handle return 0, false or NULL; fq_op_get_id(),
 *    fq_result_status() and fq_event_progress() return FQ_ERR_INVALID.
 *  - Threading: every function may be called from any thread unless its
 *    comment says otherwise. Callbacks are never called while the library
 *    holds a lock, so a callback may call back into the library (submit,
 *    cancel, set_priority, ...) without deadlock. The engine's own threads
 *    (where bodies and callbacks run) have stacks of 8 MiB, or the
 *    process's default thread stack size when that is larger (ulimit -s,
 *    pthread_setattr_default_np).
 *
 * THE COMPLETION CONTRACT. A submit function returns an operation id > 0, or
 * a negative fq_status — and then the completion callback is never called.
 * After a successful submit the completion callback is called EXACTLY ONCE,
 * with outcome FQ_SUCCEEDED, FQ_FAILED or FQ_CANCELLED: also when the
 * operation is cancelled before it starts, when a dependency fails, when it
 * waits in its queue too long, and when the engine is freed with the
 * operation still pending. After that call returns, the library never uses
 * the callback or its userdata for that operation again.
 */
#ifndef FETCHQ_H
#define FETCHQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Version                                                              */
/* ------------------------------------------------------------------ */

#define FQ_VERSION_MAJOR 0
#define FQ_VERSION_MINOR 1
#define FQ_VERSION_PATCH 0
#define FQ_VERSION_STRING "0.1.0"
/* 0xMMmmpp: compare with fq_version() to detect a header/library mismatch. */
#define FQ_VERSION_HEX \
    ((FQ_VERSION_MAJOR << 16) | (FQ_VERSION_MINOR << 8) | FQ_VERSION_PATCH)

/* The version of the library loaded at run time, as FQ_VERSION_HEX. */
uint32_t fq_version(void);
/* The same as a static string, e.g. "0.1.0". Never NULL, never freed. */
const char *fq_version_string(void);

/* ------------------------------------------------------------------ */
/* Status codes                                                         */
/* ------------------------------------------------------------------ */

typedef enum fq_status {
    FQ_OK = 0,
    FQ_ERR_INVALID = -1,       /* bad argument, NULL handle, bad option/config */
    FQ_ERR_NOT_FOUND = -2,     /* unknown operation id (or one already finished) */
    FQ_ERR_STATE = -3,         /* not allowed now (e.g. op already started, or
                                  called from a callback where that would deadlock) */
    FQ_ERR_CYCLE = -4,         /* the dependency would create a cycle */
    FQ_ERR_SHUTDOWN = -5,      /* the engine is being freed */
    FQ_ERR_TIMEOUT = -6,       /* a wait, or an operation's time limit, ran out */
    FQ_ERR_CANCELLED = -7,     /* the operation was cancelled */
    FQ_ERR_DEPENDENCY = -8,    /* a dependency failed or was cancelled */
    FQ_ERR_OPERATION = -9,     /* the operation's body reported an error */
    FQ_ERR_QUEUE_TIMEOUT = -10, /* waited in the queue longer than max_wait_ms */
    FQ_ERR_HTTP = -11,         /* the server answered with a status not accepted */
    FQ_ERR_NETWORK = -12,      /* connection refused/reset/closed, DNS, bad framing */
    FQ_ERR_TOO_LARGE = -13,    /* the response exceeded max_response_bytes */
    FQ_ERR_PARSE = -14,        /* the body is not valid JSON, is too deep, or holds
                                  what jansson cannot (an integer beyond 64 bits, a
                                  number beyond a double such as 1e400, a NUL in an
                                  object key) */
    FQ_ERR_TLS = -15,          /* TLS handshake or certificate verification failed */
    FQ_ERR_REDIRECT = -16,     /* too many redirects */
    FQ_ERR_NOMEM = -17,        /* out of memory, or the system refused a thread
                                  (where fetchq can go on: starting the engine
                                  or its threads, parsing a response; most other
                                  failed allocations stop the process, as the
                                  Swift runtime cannot recover from them) */
    FQ_ERR_STORE = -18,        /* the item store (SQLite) failed */
    FQ_ERR_CACHE_MISS = -19    /* "cache": "only-if-cached" and nothing cached */
} fq_status;

/* A static English description of a status. Never NULL, never freed. */
const char *fq_strerror(int status);

/* The message of the last failed call made by this thread (a submit, a
 * setter, fq_engine_new, ...). BORROWED: valid until the next fq_ call on
 * this thread. "" when there is none. */
const char *fq_last_error(void);

/* The status of the same failed call (FQ_OK when there is none): what a
 * function returning NULL (fq_engine_new, fq_queue_new, fq_store_open, ...)
 * failed with — FQ_ERR_INVALID for a bad argument, config or option,
 * FQ_ERR_NOMEM when the system refused memory or a thread, FQ_ERR_STORE for
 * a cache or store file that could not be opened, FQ_ERR_SHUTDOWN while the
 * engine is being freed. Like fq_last_error(), a later successful call does
 * not reset it. */
int fq_last_status(void);

/* ------------------------------------------------------------------ */
/* Types                                                                */
/* ------------------------------------------------------------------ */

typedef struct fq_engine fq_engine; /* the shared machinery: workers, delivery, transport */
typedef struct fq_queue fq_queue;   /* ordering + max concurrency; many per engine */
typedef struct fq_op fq_op;         /* an operation seen from inside its own body */
typedef struct fq_result fq_result; /* an operation's outcome, seen in its callback */
typedef struct fq_event fq_event;   /* a progress event, seen in an event callback */
typedef struct fq_store fq_store;   /* an item store (SQLite file) */

/* Operation ids are > 0 and never reused by an engine. A submit that fails
 * returns the negative fq_status instead. */
typedef int64_t fq_op_id;

typedef enum fq_outcome {
    FQ_SUCCEEDED = 1,
    FQ_FAILED = 2,
    FQ_CANCELLED = 3
} fq_outcome;

/* Called exactly once per successfully submitted operation (see THE
 * COMPLETION CONTRACT above). `result` is BORROWED and, with everything it
 * hands out, valid until the callback returns. Runs on the engine's delivery
 * thread (config "delivery": "thread", the default; callbacks are serialized),
 * in "inline" mode on the delivery thread, a worker or a transfer thread
 * (still serialized and in completion order), or, in poll mode, on the thread calling fq_engine_dispatch(),
 * fq_queue_wait(), fq_engine_wait_idle(), fq_wait() or fq_engine_free()
 * (serialized and in completion order too when several threads do: a
 * dispatch waits for another thread's callbacks; a wait leaves them to it
 * meanwhile). It may call any fq_ function except those that would wait for
 * itself: fq_engine_free(), fq_engine_wait_idle(), fq_queue_wait(),
 * fq_wait() and fq_engine_dispatch() of the same engine return FQ_ERR_STATE
 * there. */
typedef void (*fq_completion_fn)(const fq_result *result, void *userdata);

/* The body of a block operation; runs on a worker thread. Return a value
 * (NEW reference, STOLEN by the library; NULL for no value), or call
 * fq_op_set_error() and return NULL to fail. `op` is valid only during the
 * call. It should check fq_op_is_cancelled() when it runs long. */
typedef json_t *(*fq_block_fn)(fq_op *op, void *userdata);

/* The start function of an asynchronous operation; runs on a worker thread
 * and should return quickly. The operation stays running — it keeps its
 * slot in the queue's max_concurrent — until fq_op_finish(op, ...) is called,
 * from any thread, exactly once. `op` stays valid until then. When the start
 * function itself calls fq_op_finish, the operation has ended at that call:
 * its callback may run, and fq_queue_wait()/fq_engine_wait_idle() may
 * return, before the start function returns (fq_engine_free() waits for it). */
typedef void (*fq_async_fn)(fq_op *op, void *userdata);

/* ------------------------------------------------------------------ */
/* Engine                                                               */
/* ------------------------------------------------------------------ */

/* Creates an engine. `config` is BORROWED (may be NULL for defaults):
 *   "delivery"      "thread" (default) | "inline" | "poll". "inline" is
 *                   "thread" without the hand-off when it is not needed: when
 *                   no callback is running or waiting, the engine thread that
 *                   ended an operation (a worker, or the transfer thread that
 *                   received a response) runs its callback itself, and then
 *                   those of operations that ended on other threads
 *                   meanwhile (up to 4 more batches of them; the delivery
 *                   thread runs any beyond). Callbacks stay one at a time
 *                   and in completion order, but run on several threads, and
 *                   a slow callback holds up that thread: a worker, or a
 *                   transfer thread and its other transfers. Callbacks never
 *                   run on the application's own threads in this mode either.
 *                   In both modes, while operations keep ending, the delivery
 *                   thread is not woken for each callback: between batches it looks again
 *                   every 0.1 ms, so a callback may start up to about 0.1 ms
 *                   after its operation ended
 *   "workers"       worker threads for block/async bodies and for parsing
 *                   responses larger than 64 KiB, 1..256 (default: number of
 *                   CPUs, at least 2). Every operation's end is booked under
 *                   one engine lock: for a flood of bodies that do almost
 *                   nothing, workers take turns at that lock, and 1 worker
 *                   ran no-op operations faster than 2 (1.3 M against 1.1 M
 *                   per second on 2 cores; bench/findings.md, "Tenth round").
 *                   A block or async operation starts (it counts as running
 *                   in its queue's max_concurrent and in the stats) when it
 *                   is handed to the workers: with more started than
 *                   workers, some wait for a thread, and suspending the
 *                   queue, fq_set_priority (FQ_ERR_STATE) and "max_wait_ms"
 *                   no longer apply to them; cancelled, they end
 *                   FQ_CANCELLED when a worker takes them up, without their
 *                   body or start function running. Give "workers" at least
 *                   the sum of the max_concurrent of queues that run such
 *                   operations at once, for a max_concurrent that bounds
 *                   bodies running
 *   "transfer_threads" threads running network transfers, each with its own
 *                   libcurl connections (1..16, default 2). Connections are
 *                   opened close-on-exec, so a child the application spawns
 *                   does not hold them open (libcurl 7.88's own wake-up
 *                   socket pair, one per transfer thread, is not). A transfer thread
 *                   ends the operations whose responses it received itself —
 *                   parses the body, starts what that unblocks — unless the
 *                   body is larger than 64 KiB or the result is written to
 *                   SQLite (a search's "store", a persistent "cache"); those
 *                   go to a worker. The transfer threads start with the
 *                   first network operation, not in fq_engine_new(): if the
 *                   system refuses one then, that operation (and each after
 *                   it, until one starts) ends FQ_ERR_NOMEM
 *   "aging_ms"      a ready operation waiting this long gains one priority
 *                   level (one of the five: -8 counts as -4), and another
 *                   each further aging_ms, so low
 *                   priority work is never starved by higher priorities of
 *                   its QoS (default 1000; 0 = off). It ages from when it
 *                   last became ready, also while its queue is suspended. Aging
 *                   does not cross QoS classes: across queues a higher QoS
 *                   always goes first, so lower-QoS work waits for as long
 *                   as higher-QoS work keeps its queues busy
 *   "history"       how many finished operations stay known for depends_on
 *                   (default 4096, 0..1000000)
 *   "history_values" how many of the newest finished network operations
 *                   (requests, searches, search-alls) keep their whole result — value,
 *                   headers, body — for an operation that depends on one
 *                   after it finished (default 32, 0..1000000); block and
 *                   async operations keep theirs for all of "history".
 *                   Dependencies that finish after the dependent was
 *                   submitted always pass their result. An older one still
 *                   counts as succeeded, but fq_op_dependency() gives a
 *                   result with no value, HTTP status, headers, body or
 *                   metrics whose fq_result_error() says it is no longer
 *                   kept. What is
 *                   kept is the response (status, headers, body): the value
 *                   such a dependent reads is parsed again from the body on
 *                   its first read, equal to the callback's but another
 *                   json_t, while the callback's document is freed once the
 *                   callback and your retains are done with it (a search
 *                   with "store" keeps its own result: its value says what
 *                   storing did). Each kept response costs memory
 *   "max_per_host"  network operations running at once per host:port across
 *                   all queues (default 6, 1..1024). The engine keeps an
 *                   entry (name, counters, rate bucket: about 0.1-0.3 KB)
 *                   for each host:port it has sent to until it is freed: a
 *                   long-lived engine crawling unbounded hosts grows by that
 *   "connect_timeout_ms" (default 10000; 0 = libcurl's own 300 s),
 *                   "timeout_ms" total per attempt, redirects included (each
 *                   retry has its own; default 60000; 0 = none),
 *                   "max_wait_ms" time allowed in a queue, from the submit
 *                   (waiting for dependencies included) to the start, before
 *                   FAILED with FQ_ERR_QUEUE_TIMEOUT (default 0 = none), "max_redirects" (default 5; 0 = do not follow),
 *                   "max_response_bytes" (default 16777216), "max_json_depth"
 *                   (default 512), "verify_tls" (default true), "ca_file"
 *                   (a PEM file, not ""; default the system store),
 *                   "user_agent" (default "fetchq/VERSION"; "" sends no
 *                   User-Agent header), "proxy" (an http:// or https://
 *                   proxy URL every request goes through; "" for none; by
 *                   default libcurl's environment variables http_proxy,
 *                   https_proxy, all_proxy and no_proxy apply — lower case
 *                   only for http_proxy, as curl reads it)
 *   "rate_limits"   {"HOST": {"per_second": r, "burst": b}, ...}: a token
 *                   bucket per host:port: at most b network operations start
 *                   at once and r per second on average; operations over the
 *                   rate wait in their queue without holding back other hosts.
 *                   HOST is "host:port" (as in the URL, default ports
 *                   omitted: http://h and https://h are "h", so a key
 *                   "h:80" applies only to https://h:80 and "h:443" only to
 *                   http://h:443), "host" (each of its ports, each with a bucket of
 *                   its own) or "*" (every host:port without its own entry,
 *                   each with a bucket of its own), compared without case:
 *                   anything else (a host that is not ASCII, a port written
 *                   empty or with a leading zero, "*:port"), or two
 *                   keys naming one host, is FQ_ERR_INVALID; burst defaults
 *                   to max(1, r)
 *   "cache"         the HTTP cache shared by the engine's GET requests and
 *                   searches: {"max_bytes": N (default 67108864; 0 = no
 *                   cache), "path": FILE (optional: persist entries in this
 *                   SQLite file, which may be an item store's)}. It honours
 *                   Cache-Control (max-age, no-store, no-cache,
 *                   must-revalidate), Expires/Date and Age, revalidates with
 *                   ETag / Last-Modified (a 304 refreshes the entry; a 304
 *                   that matches no entry makes the request again without
 *                   validators), and evicts the least recently used entries
 *                   beyond max_bytes. A request's "Pragma: no-cache" counts
 *                   as "Cache-Control: no-cache" when it has no
 *                   Cache-Control. The age a Date header implies is not
 *                   added (a server clock that is off must not make every
 *                   response stale), and served entries get no new Age
 *                   header. An entry is kept per URL and request headers
 *                   (all of them, so a response that varies with one, Vary,
 *                   is never given for another value); a response with
 *                   "Vary: *" is not stored. The file (created readable by
 *                   its owner only) never holds an entry whose request
 *                   carried credentials (Authorization, Proxy-Authorization,
 *                   Cookie, a password in the URL): those stay in memory. Writes to it wait at
 *                   most 100 ms for another writer's lock; one that cannot
 *                   is skipped (the entry stays in memory; a removal's
 *                   row is not read back, and goes at the next write that
 *                   works) and a warning is
 *                   logged once per run of such failures. Engines sharing a
 *                   file share its rows, not their memory: an entry one
 *                   removes may still be served from another's memory, and
 *                   each bounds the file by the rows it knows of (the next
 *                   open trims it to max_bytes). A file deleted while the
 *                   engine runs is made again at its path at the next
 *                   write, and a notice is logged; what the old file held
 *                   is not written again. One replaced by another file
 *                   (moved into its path) is not followed, which SQLite
 *                   cannot do safely, and a warning is logged: writes go
 *                   on to the file opened and its log beside the path,
 *                   which the next opener of the new file reads over it
 *                   (SQLite's hazard of a file renamed while open): replace
 *                   the file only while no engine has it open
 *   "log"           "off", "critical", "error", "warning", "notice", "info",
 *                   "debug" or "trace" (default: the FETCHQ_LOG environment
 *                   variable, else "warning"); lines go to standard error or
 *                   to the function set with fq_engine_set_log_fn()
 *   "search"        the search endpoint, an object:
 *                   "url" (a template containing {query} before any
 *                   "#fragment"), "results" (a JSON
 *                   Pointer to the results array, default ""), "id" (pointer
 *                   to an item's id, default "/id"), "sort" (pointer to the
 *                   sort key; default none = server order), "order" ("asc" |
 *                   "desc", default "desc")
 * On failure returns NULL and, if errbuf is not NULL, writes a NUL-terminated
 * message of at most errlen bytes (also available from fq_last_error()).
 * After fork(), an engine made before belongs to the parent: its threads do
 * not exist in the child, so the child must neither use nor free it (make a
 * new engine there). A fork while an engine of the process has work under
 * way can leave a lock held for ever in the child — the Swift runtime's,
 * libcurl's or libc's, taken by an engine thread at that moment (POSIX
 * allows the child of a multi-threaded process only async-signal-safe calls
 * until it execs) — and a new engine there may hang: fork before the first
 * engine, or while every engine is idle (fq_engine_wait_idle() returned and
 * nothing was submitted since), or exec in the child. */
fq_engine *fq_engine_new(const json_t *config, char *errbuf, size_t errlen);

/* Frees the engine: cancels every pending operation, signals running ones to
 * cancel, waits for running operations to end (an async operation must still
 * be finished with fq_op_finish, by another thread than this one: a program
 * whose own loop finishes async operations must finish them before it calls
 * fq_engine_free there, which otherwise never returns), delivers every outstanding callback (in poll
 * mode, on this thread), stops the threads and releases everything, queues
 * included (their handles become invalid). Returns FQ_OK, or FQ_ERR_STATE
 * without doing anything when called from a callback or an operation body of
 * this engine. NULL is a no-op returning FQ_OK. While it runs, submits and
 * fq_queue_new() from callbacks and operation bodies fail with
 * FQ_ERR_SHUTDOWN (fq_queue_new returns NULL). */
int fq_engine_free(fq_engine *engine);

/* Waits until every operation submitted to the engine has finished and its
 * callback has returned, including those that callbacks and operation bodies
 * submit while it waits (a chain of callbacks, each submitting the next, is
 * waited for to its end). timeout_ms < 0 waits forever. Returns FQ_OK or
 * FQ_ERR_TIMEOUT; FQ_ERR_STATE when called from a callback or operation body
 * of the same engine, in every delivery mode (it could wait for itself). In
 * poll mode it runs the callbacks on the calling thread while it waits (with
 * timeout_ms 0 it does not wait but still runs the callbacks already
 * waiting). */
int fq_engine_wait_idle(fq_engine *engine, int timeout_ms);

/* Log lines: `level` is one of the FQ_LOG_* values, `message` BORROWED for
 * the call. Called on whichever engine thread logs, possibly several at once;
 * it must be thread-safe and return quickly. */
typedef enum fq_log_level {
    FQ_LOG_TRACE = 0, FQ_LOG_DEBUG = 1, FQ_LOG_INFO = 2, FQ_LOG_NOTICE = 3,
    FQ_LOG_WARNING = 4, FQ_LOG_ERROR = 5, FQ_LOG_CRITICAL = 6
} fq_log_level;
typedef void (*fq_log_fn)(int level, const char *message, void *userdata);

/* Sends the engine's log lines (at config "log"'s level and above) to `fn`
 * instead of standard error; NULL restores standard error. `fn` is never
 * called with a library lock held and may call any fq_ function except the
 * five that would wait (FQ_ERR_STATE there, as in a completion callback:
 * fq_engine_free, fq_engine_wait_idle, fq_queue_wait, fq_wait,
 * fq_engine_dispatch of the same engine). A line about an operation may
 * come after its callback, or after fq_wait() for it returned. */
int fq_engine_set_log_fn(fq_engine *engine, fq_log_fn fn, void *userdata);

/* Counters, NEW reference (NULL for a NULL engine):
 * {"submitted", "succeeded", "failed", "cancelled", "queued", "running",
 *  "undelivered", "queues": {"<name>": {"max_concurrent", "suspended",
 *  "queued", "running", "submitted", "succeeded", "failed", "cancelled"}},
 *  "cache": {"entries", "bytes", "hits", "misses", "evictions"} (when the
 *  HTTP cache is on; "hits" and "misses" count the cache's look-ups — one
 *  per transfer, so callers sharing a coalesced transfer count once —
 *  and "evictions" the entries dropped for room while storing), "jansson_cache": {"bytes", "limit"} (when fetchq's
 *  jansson allocation functions are installed, see the conventions above;
 *  for the whole process, not this engine: "bytes" is the room the engine
 *  threads of all engines hold for freed jansson blocks, taken 256 KiB at a
 *  time; they keep at most that much, and it is at most "limit", 64 MiB)}.
 *  Coalesced transfers are counted once in "running" while their first
 *  caller runs them (one taken over by an internal operation, its first
 *  caller having left, counts none, though it keeps the slot the first
 *  caller had in its queue's max_concurrent and in max_per_host until the
 *  transfer ends); the operations sharing them count as
 *  "queued" until they end, so submitted = succeeded + failed + cancelled +
 *  queued + running.
 * "queued" counts operations waiting (for dependencies, a slot or resume),
 * "undelivered" finished operations whose callback has not yet returned. */
json_t *fq_engine_stats(fq_engine *engine);

/* Poll mode: a file descriptor that is readable while completions wait to
 * be dispatched. Owned by the engine; do not read or close it. It may be
 * watched level- or edge-triggered (EPOLLET): it is written when a
 * completion arrives with none waiting, and again by a dispatch that leaves
 * some waiting (a `max` below their number). Returns -1 (FQ_ERR_INVALID) for
 * thread or inline delivery mode or a NULL engine. */
int fq_engine_event_fd(fq_engine *engine);

/* Poll mode: runs up to `max` waiting callbacks on the calling thread
 * (max <= 0: all that are waiting now). Returns how many ran, or a negative
 * status (FQ_ERR_STATE in thread or inline delivery mode, or when called from
 * a callback or an operation body of the same engine). */
int fq_engine_dispatch(fq_engine *engine, int max);

/* ------------------------------------------------------------------ */
/* Queues                                                               */
/* ------------------------------------------------------------------ */

/* Creates a queue. `name` is copied and must be unique among the engine's
 * live queues (it keys fq_engine_stats). max_concurrent >= 1 is how many of
 * its operations may run at once. Returns NULL on error (fq_last_error()). */
fq_queue *fq_queue_new(fq_engine *engine, const char *name, int max_concurrent);

/* Releases the handle. Operations of the queue that have not started are
 * cancelled (their callbacks run with FQ_CANCELLED); running ones finish
 * normally. Returns at once. NULL is a no-op. */
void fq_queue_free(fq_queue *queue);

/* Changes max_concurrent (>= 1); more operations start at once if it grew. */
int fq_queue_set_max_concurrent(fq_queue *queue, int max_concurrent);

/* A suspended queue starts nothing new; running operations go on. */
int fq_queue_set_suspended(fq_queue *queue, bool suspended);

/* Cancels every operation of the queue. Returns how many were cancelled
 * (>= 0) or a negative status. */
int fq_queue_cancel_all(fq_queue *queue);

/* Waits until every operation submitted to this queue has finished and its
 * callback has returned (like waitUntilAllOperationsAreFinished). Same
 * timeout, poll-mode and FQ_ERR_STATE rules as fq_engine_wait_idle(). */
int fq_queue_wait(fq_queue *queue, int timeout_ms);

/* ------------------------------------------------------------------ */
/* Submitting operations                                                */
/* ------------------------------------------------------------------ */

/* Options common to every submit (`options` is BORROWED, may be NULL):
 *   "priority"   -8, -4, 0, 4, 8 or "very-low", "low", "normal", "high",
 *                "very-high" (default 0). Higher starts first; FIFO within a
 *                level, in the order the operations became ready (submitted,
 *                or their last dependency ended); waiting operations age
 *                (see config "aging_ms").
 *   "qos"        "user-interactive", "user-initiated", "default", "utility",
 *                "background": when queues compete for worker threads and
 *                hosts, higher QoS goes first; within a queue it breaks ties
 *                between equal priorities (default "default").
 *   "group"      a string tag for fq_cancel_group() (compared as bytes, as
 *                queue names are).
 *   "depends_on" an array of operation ids (any queue of this engine). The
 *                operation starts after all of them succeeded; if one fails
 *                or is cancelled it ends FQ_CANCELLED with status
 *                FQ_ERR_DEPENDENCY and a message naming that id. An unknown
 *                id, or one that finished longer ago than config "history"
 *                remembers, fails the submit with FQ_ERR_NOT_FOUND. An id may
 *                appear more than once (it counts once). A block or async
 *                submit does not wait for the engine's lock when its ids are
 *                still remembered; the only ids it cannot tell at once are
 *                ones no submit returned (the id a failed submit used up, or
 *                one another thread's submit has not returned yet): the
 *                operation then ends FQ_CANCELLED with status
 *                FQ_ERR_NOT_FOUND ("no operation N") instead.
 *   "barrier"    true: starts only after everything submitted to the queue
 *                before it has finished, and nothing submitted after it
 *                starts before it has finished. A barrier that ends without
 *                running (cancelled, "max_wait_ms", a failed dependency)
 *                holds nothing back from then on, unless an earlier barrier
 *                of the queue is still pending: that one holds it all.
 *   "max_wait_ms" overrides the engine's max_wait_ms for this operation.
 * `done` may be NULL (no callback). `userdata` is passed to `done` (and to the
 * body of block/async operations) untouched. */

fq_op_id fq_submit_block(fq_queue *queue, fq_block_fn fn, const json_t *options,
                         fq_completion_fn done, void *userdata);

fq_op_id fq_submit_async(fq_queue *queue, fq_async_fn fn, const json_t *options,
                         fq_completion_fn done, void *userdata);

/* Network operations (requests and searches) also accept, in `options`:
 *   "connect_timeout_ms", "timeout_ms", "max_redirects", "max_response_bytes",
 *   "max_json_depth", "verify_tls", "ca_file", "user_agent", "proxy" — overriding the
 *                engine's config for this operation (same meaning);
 *   "progress"   true: FQ_EVENT_PROGRESS events for this operation go to the
 *                engine's event function (see fq_engine_set_event_fn);
 *   "progress_interval_ms" the least time between two progress events
 *                (default 100; implies "progress": true, and given with
 *                "progress": false it is FQ_ERR_INVALID);
 *   "retry"      {"max": N (default 0: no retry), "base": seconds (0.5),
 *                "max_delay": seconds (30), "on": [statuses, "network",
 *                "timeout"] (default [408, 429, 500, 502, 503, 504, "network",
 *                "timeout"]), "any_method": false}: the delay before retry n is
 *                base * 2^(n-1), capped at max_delay, times a random factor in
 *                [0.5, 1]; a Retry-After header (seconds or HTTP-date) is used
 *                instead when present (capped at max_delay). Only idempotent
 *                methods (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) are retried
 *                unless "any_method" is true. A body that cannot be decoded
 *                from its Content-Encoding (corrupt, or bytes after its end)
 *                ends FQ_ERR_NETWORK and is not retried: the server would
 *                send it alike. Waiting for a retry holds no
 *                slot; cancelling then ends the operation at once. The metrics'
 *                "attempts" counts the tries; the request the HTTP cache
 *                makes again without validators after a 304 (see "cache") is
 *                one, but not a retry: it does not count against "max". A
 *                retry of a GET the cache revalidates sends the same
 *                validators; its answer is stored, and stale-while-revalidate
 *                keeps the stale value if the last one fails. Apart from retries: when a
 *                kept-alive HTTP/1.1 connection closes before any byte of the
 *                answer, libcurl sends an idempotent request again on another
 *                connection, each time that happens: after a server restart,
 *                once per connection it kept to that server, then on a new
 *                one (neither counted in "attempts", nor waiting for a
 *                backoff); any other method
 *                ends FQ_ERR_NETWORK ("not sent again": the server may have
 *                acted on it, RFC 9112 §9.3.1.1) and is retried only
 *                with "any_method". Over HTTP/2 libcurl sends a stream the
 *                server refused unprocessed (REFUSED_STREAM, or one opened
 *                after a GOAWAY had arrived) again whatever its method; a
 *                stream that a GOAWAY arriving while it was sent refuses
 *                ends FQ_ERR_NETWORK ("HTTP2 framing layer") and is retried
 *                only as above;
 *   "coalesce"   true (default): a GET without a body, "depends_on" or
 *                "barrier" that is identical to one in flight (same URL,
 *                headers, limits, "retry" and progress setting) shares its
 *                transfer:
 *                the server sees one request; each operation still gets its
 *                own callback and result (an operation that shares the transfer of
 *                one in another queue does not wait for an open barrier of
 *                its own queue). The first caller runs the shared
 *                transfer in its queue (the others hold no slot) at the
 *                highest priority of its callers (fq_set_priority on the
 *                first caller does not take it below the others'). Cancelling
 *                one caller detaches only it, the first included: a running
 *                transfer goes on for the others (and is still retried under
 *                the first caller's "retry"; one waiting to be retried still
 *                waits out its Retry-After or backoff, and its "attempts"
 *                go on counting), a queued one is queued in the next
 *                caller's queue at the callers' priority; the transfer
 *                is cancelled when the last caller cancels. A first caller
 *                given a dependency by fq_add_dependency leaves the transfer
 *                to the others. false: its own transfer;
 *   "cache"      how a GET (without a body) or a search uses the engine's HTTP
 *                cache: "default" (a fresh entry answers at once with no
 *                request; a stale one is revalidated with a conditional
 *                request), "reload" (always asks the server, stores the
 *                answer), "only-if-cached" (answers from the cache, fresh or
 *                stale, or fails with FQ_ERR_CACHE_MISS), or
 *                "stale-while-revalidate" (an entry, fresh or stale, is
 *                delivered at once as an FQ_EVENT_UPDATE event whose result
 *                says fq_result_from_cache(); then the server is asked and the
 *                completion — still exactly once — carries the fresh answer,
 *                or the failure with the stale value as fq_result_value()).
 *                Coalesced callers share the first caller's mode; a caller
 *                joins only a transfer with the same "max_wait_ms";
 *                "only-if-cached" and "stale-while-revalidate" never coalesce.
 *                An operation the cache answers without the network
 *                ("only-if-cached", or "default" with a fresh entry at submit,
 *                one in the cache's file from an earlier engine included:
 *                the submit reads it) takes no "max_per_host" slot or
 *                "rate_limits" token (one whose entry goes stale while it
 *                waits in its queue is revalidated all the same).
 *                A request with another method than GET, HEAD, OPTIONS or
 *                TRACE that gets a status below 400 removes every entry for
 *                its URL (RFC 9111 §4.4).
 *                A stale entry whose response said "must-revalidate" or
 *                "no-cache" (which makes an entry stale at once) is never
 *                served without the server (RFC 9111 §5.2.2.2, §5.2.2.4):
 *                "only-if-cached" fails with FQ_ERR_CACHE_MISS, and
 *                "stale-while-revalidate" sends no update event and keeps no
 *                stale value.
 *                Only responses that carry Cache-Control or Expires are stored,
 *                with a status of 200, 203, 204, 300, 301, 308, 404, 405, 410,
 *                414 or 501 (RFC 9110 §15.1), without "no-store" or "Vary: *";
 *                one stale on arrival (its lifetime, max-age or else Expires
 *                minus Date, not above its Age; neither given, as with
 *                "public" alone; or "no-cache") only with an ETag or
 *                Last-Modified to revalidate it (no heuristic freshness);
 *                and never one reached through a redirect; a newer answer not
 *                stored for want of them (with a status the cache stores)
 *                removes the entry it would have replaced. A 304 reached
 *                through a redirect (libcurl carries the validators to the
 *                same host) makes the request again without validators; any
 *                answer reached through a redirect removes the URL's own
 *                entry (the URL redirects now). An entry answers
 *                only a request with the same URL (its scheme and host in
 *                any case, a fragment aside, an empty path as "/", the
 *                scheme's default port written, written empty ("h:/"), or not:
 *                RFC 9110 §4.2.3, RFC 3986 §6.2.3)
 *                and headers (Cache-Control
 *                and Pragma aside: a "no-cache" request refreshes the entry
 *                the others use), the same "verify_tls" and "ca_file", and
 *                redirects followed or not alike, and the same
 *                "user_agent"; one over the request's "max_response_bytes"
 *                does not answer it.
 * Redirects (up to "max_redirects") keep the method and body on 301, 302,
 * 307 and 308, except that a POST becomes a GET without its body on 301 and
 * 302; a 303 makes any method but HEAD a GET without its body (RFC 9110
 * §15.4). A request made a GET so is sent without its Content-* headers
 * (Content-Type included). Another 3xx but 304 with a Location (300, 305,
 * ...) is followed as a 307 is; a 304 is the response, with or without a
 * Location. A progress event and "max_response_bytes" count the final
 * response's body only, never that of a redirect that was followed.
 * Authorization, Cookie and a "Host" set in "headers" are sent only to the
 * first request's scheme, host and port (again when a redirect leads back
 * there; elsewhere Host names the URL's own); a redirect to a URL that is not http or https fails with
 * FQ_ERR_NETWORK. A redirect from https to http is followed, as browsers
 * and curl do: the other headers and a kept body then travel unencrypted
 * ("max_redirects": 0 stops at the first redirect).
 * They run at most config "max_per_host" at once per host:port (across
 * queues; operations for a busy host never hold back other hosts). The host
 * is that of the request's URL: the host a redirect leads to is reached
 * within that slot, and its own "max_per_host" and "rate_limits" do not
 * count it (libcurl follows the redirect inside the transfer). A failed
 * transfer ends FQ_FAILED with FQ_ERR_TIMEOUT, FQ_ERR_NETWORK,
 * FQ_ERR_TOO_LARGE, FQ_ERR_REDIRECT or FQ_ERR_TLS; a cancelled one is removed
 * from the transport at once and ends FQ_CANCELLED. */

/* An HTTP request. `request` is BORROWED:
 *   "method"   any HTTP method token (default "GET") but CONNECT; HEAD and
 *              TRACE cannot have a body; a PUT or PATCH without one is sent
 *              with Content-Length: 0
 *   "url"      required; http:// or https:// only, with no space or control
 *              character (percent-encode them); otherwise FQ_ERR_INVALID.
 *              Bytes that are not ASCII are sent percent-encoded (%XX, RFC
 *              3987 §3.1); a host that is not ASCII is FQ_ERR_INVALID (write
 *              it in its xn-- form). A password in the URL ("user:pw@") is
 *              written *** in error messages and logs, and so is a user
 *              name without a password ("TOKEN@": often a token)
 *   "headers"  an object of strings; a name that is not a token, a value
 *              with a control character other than HTAB, or Content-Length
 *              or Transfer-Encoding (fetchq frames the body) is
 *              FQ_ERR_INVALID. A value "" (or only spaces and tabs) is
 *              sent as an empty field ("X-Empty:"), and replaces a header
 *              fetchq would send (Accept, User-Agent, Content-Type). The
 *              URL and headers together hold at most
 *              1000000 bytes (libcurl's limit on a request head)
 *   "query"    an object of strings/numbers/booleans, URL-encoded (RFC 3986)
 *              and appended to the URL
 *   "body"     a string (sent as is, with no Content-Type unless "headers"
 *              set one: curl's -d would add
 *              application/x-www-form-urlencoded), or any other JSON value
 *              (serialized and sent with Content-Type: application/json
 *              unless set).
 *              Over https:// a body of 64 KiB or more is sent over HTTP/1.1
 *              even when the server offers HTTP/2, on a connection of its
 *              own that is not kept: libcurl 7.88 over HTTP/2 waits for
 *              flow-control window to send the rest of a body that the
 *              server answered without reading, until "timeout_ms" (for
 *              ever with 0). A server that grants a stream less than
 *              HTTP/2's default window of 65535 bytes can still cause that
 *              wait for a smaller body it does not read
 * Extra options: "parse": "auto" (default: parse when the response's
 * Content-Type is application/json, application/...+json, text/json or
 * application/x-json, parameters and case aside; an empty body is no value,
 * not an error) | "json" (always; invalid JSON, a leading byte order mark
 * included, is FQ_ERR_PARSE, and so is an empty body, a 204's too) |
 * "none"; "lazy_parse": false (default) | true: the body is still checked
 * when the response arrives (invalid JSON is FQ_ERR_PARSE, as without it),
 * but its value is built only when fq_result_value() is first called on the
 * result (by the callback, or by a dependent reading its dependency): for
 * callers that read the body themselves and rarely the value, it saves
 * building the value (the check is cheaper; fq_result_has_value() says
 * whether there is a value); "marshal": false (default) | true: the walk
 * that checks the body also writes its value in CPython's marshal format,
 * for fq_result_marshal() (with "lazy_parse" that walk is the check, so it
 * costs no second pass); "accept_status": statuses that count as success
 * besides 2xx, as numbers (404) or classes ("4xx"). Any other status ends
 * FQ_FAILED with FQ_ERR_HTTP; status, headers, body (and value, if it
 * parsed) stay readable. A status that "retry" retries (its "on" list, by
 * default 503 among them) is retried even when "accept_status" names it:
 * only the last attempt's answer is accepted. */
fq_op_id fq_submit_request(fq_queue *queue, const json_t *request, const json_t *options,
                           fq_completion_fn done, void *userdata);

/* Many requests at once: one operation per URL in `urls` (n UTF-8 strings,
 * copied), each the BORROWED `request` object with that "url" (so `request`
 * must not hold "url"; NULL is a plain GET), all with the same `options` and
 * `done`, and userdata[i] for the i-th (`userdata` may be NULL: NULL for
 * each). The same as n calls of fq_submit_request in order, except that the
 * request, the options and every URL are checked before any operation is
 * submitted, and the options are read once. The engine's lock is taken once
 * per 64 operations, so a long batch does not hold up transfers that end
 * meanwhile. Returns how many operations were submitted, their ids in ids[0],
 * ids[1], ... (`ids` may be NULL): n, unless the engine stopped taking them
 * during the call (it began shutting down; or, with "depends_on", a
 * dependency left the engine's history meanwhile); then fewer, and
 * fq_last_error() says why. Those submitted are ordinary operations, each
 * with its callback; the others never get one. Returns a negative fq_status
 * when nothing was submitted: an invalid request, option or URL (the message
 * names urls[i]), a NULL queue, `urls` NULL or holding a NULL. n == 0
 * returns 0. */
int64_t fq_submit_requests(fq_queue *queue, const json_t *request, const char *const *urls, size_t n,
                           const json_t *options, fq_completion_fn done, void *const *userdata,
                           fq_op_id *ids);

/* A search: `query` (UTF-8, copied) is percent-encoded (RFC 3986) into the
 * {query} of the engine's "search" "url" template (a query of dots alone,
 * "." or "..", is written %2E in the path, so that it cannot be read as a
 * dot-segment that moves the request to another path); the response is parsed,
 * the results array extracted at the "results" pointer and sorted by the
 * "sort" pointer (numbers numerically, strings by code point; values of
 * different types in the order null, boolean, number, string, array, object,
 * reversed by "order": "desc"; items without the key last in either order;
 * ties keep the server's order). The value is {"query": q, "items": [...],
 * "count": N}; a search that failed with FQ_ERR_HTTP (any status but 2xx)
 * has the response's parsed document as its value, if it was JSON.
 * Options may override any "search" key ("url", "results", "id", "sort",
 * "order"); without an engine "search" config, "url" is required. A results
 * pointer that selects nothing or a non-array is FQ_ERR_PARSE.
 * Option "store": {"path": FILE, "collection": NAME, "merge": "overwrite"
 * (default: server data wins) | "keep-local" (stored items are kept, new ids
 * inserted)} upserts the extracted items by their "id" into the item store
 * (see fq_store_open), in one transaction per response, after parsing; the
 * value then also has "store": {"inserted", "updated", "unchanged",
 * "skipped" (items without an id, or with a null one, and items whose id an
 * item sorted before them in the same response has: the first one is stored,
 * the one a search-all keeps)}. A store failure,
 * results that are not objects included, is FQ_ERR_STORE: the submit itself
 * returns it (and no callback follows) when the file cannot be opened, the
 * callback's status when writing fails. The engine keeps
 * the 8 store files its searches used last open between searches; an older
 * one is closed once no search uses it (and opened again when one does). */
fq_op_id fq_submit_search(fq_queue *queue, const char *query, const json_t *options,
                          fq_completion_fn done, void *userdata);

/* A fan-out search: one child search per distinct query in `queries` (n
 * UTF-8 strings, copied; distinct as bytes: "\xc3\xa9" and "e\xcc\x81" are
 * two queries, however alike they look), each a normal operation of `queue` — it honours the
 * queue's max_concurrent, priorities, per-host limits and cancellation — and
 * a parent that completes once, after every child ended, with
 *   {"items": [...], "count": N,
 *    "queries": {"<q>": {"count": n} | {"error": "...", "status": fq_status
 *                                        [, "http_status": n]}}}
 * where items are merged in query order, de-duplicated by the "id" pointer
 * (the first occurrence wins: an earlier query's item over a later query's,
 * and among one query's items, which are each sorted as by fq_submit_search,
 * the one sorted first — so with "order" reversed another of two items
 * sharing an id in one response may win; items without an id, or with a
 * null one, are all kept) and
 * sorted by the "sort" pointer. The returned id is the parent's: cancelling it (or its
 * group) cancels the children; `done` is called once, for the parent only.
 * Options: those of fq_submit_search (applied to every child; "priority",
 * "qos", "group", "depends_on", "max_wait_ms" too) plus
 *   "fail_fast"    true: the first failing query cancels the others and the
 *                  parent ends FQ_FAILED with that query's status (default
 *                  false: a failing query gives a partial result);
 *   "child_events" true: an FQ_EVENT_CHILD event (fq_engine_set_event_fn) as
 *                  each child ends, before the parent's callback; when the
 *                  parent is cancelled, each child not ended yet gets its
 *                  event then, as cancelled (one event per child).
 * "barrier" is not supported (FQ_ERR_INVALID). n must be >= 1; `queries`
 * NULL or holding a NULL is FQ_ERR_INVALID. In fq_engine_stats a search-all
 * counts as one operation per distinct query plus one (the parent). */
fq_op_id fq_submit_search_all(fq_queue *queue, const char *const *queries, size_t n,
                              const json_t *options, fq_completion_fn done, void *userdata);

/* ------------------------------------------------------------------ */
/* Events                                                               */
/* ------------------------------------------------------------------ */

typedef enum fq_event_type {
    FQ_EVENT_PROGRESS = 1, /* bytes received so far / expected (0 if unknown) */
    FQ_EVENT_CHILD = 2,    /* a search-all child ended (fq_event_result) */
    FQ_EVENT_UPDATE = 3    /* stale-while-revalidate: the cached result (fq_event_result) */
} fq_event_type;

/* Called for events of operations that asked for them. Runs where
 * completions run (delivery thread, an engine thread in inline mode, or the
 * dispatching thread), always before the operation's completion callback. `event` is
 * BORROWED for the call. */
typedef void (*fq_event_fn)(const fq_event *event, void *userdata);

/* Sets (or with fn == NULL clears) the engine's event function. Events
 * already queued are delivered to the function that was set when they
 * happened. Like completion callbacks, it is never called with a library
 * lock held and may call any fq_ function except the five that would wait
 * (FQ_ERR_STATE there: fq_engine_free, fq_engine_wait_idle, fq_queue_wait,
 * fq_wait, fq_engine_dispatch of the same engine). */
int fq_engine_set_event_fn(fq_engine *engine, fq_event_fn fn, void *userdata);

fq_op_id fq_event_op_id(const fq_event *event);
fq_event_type fq_event_get_type(const fq_event *event);
/* FQ_EVENT_PROGRESS: bytes of the body received so far (decoded, if it was
 * gzip: never fewer than the event before, but a retry counts its answer
 * from 0 again, after the failed attempt's events) and expected in all (0 when the
 * server did not say, and for a body with a Content-Encoding, whose
 * Content-Length counts the encoded bytes). Either pointer may be NULL. Events are throttled by
 * "progress_interval_ms"; a successful transfer's last event always has
 * received == the body's size (an empty body has that one event, 0 and 0). */
int fq_event_progress(const fq_event *event, uint64_t *received, uint64_t *expected);
/* FQ_EVENT_CHILD: fq_event_op_id() is the parent's id; this is the child's
 * result (its own id, outcome, status, value {"query","items","count"} or
 * error). FQ_EVENT_UPDATE: the result built from the cached response
 * (fq_result_from_cache() is true). BORROWED for the event call. NULL for
 * other events. */
const fq_result *fq_event_result(const fq_event *event);
/* FQ_EVENT_CHILD: the child's query. BORROWED for the event call. */
const char *fq_event_query(const fq_event *event);

/* ------------------------------------------------------------------ */
/* Inside an operation's body                                           */
/* ------------------------------------------------------------------ */

/* The id of the operation. */
fq_op_id fq_op_get_id(const fq_op *op);

/* true once the operation has been cancelled (fq_cancel, a group or queue
 * cancel, engine free). A long body should check it and return early. */
bool fq_op_is_cancelled(const fq_op *op);

/* Block operations, during their body: the operation will end FQ_FAILED with
 * status FQ_ERR_OPERATION and this message (copied; NULL gives a generic
 * message; called again, the last message wins). Any returned value is then
 * discarded. FQ_ERR_STATE for an async operation's handle. */
int fq_op_set_error(fq_op *op, const char *message);

/* Async operations: ends the operation, exactly once, from any thread.
 * `value` is STOLEN (NULL for none). error == NULL: FQ_SUCCEEDED with value;
 * otherwise FQ_FAILED with FQ_ERR_OPERATION and this message (copied; value
 * discarded). If the operation was cancelled meanwhile it ends FQ_CANCELLED.
 * `op` stays valid until fq_op_finish() has been called and the start
 * function has returned; a second fq_op_finish() in that time returns
 * FQ_ERR_STATE (and releases `value`); after that `op` is invalid. Returns
 * FQ_ERR_STATE (and releases `value`) for a block operation's handle. */
int fq_op_finish(fq_op *op, json_t *value, const char *error);

/* The value of a dependency named in "depends_on" (data passing down a
 * chain). BORROWED: valid until this operation finishes. NULL if `dep` is not
 * one of its dependencies, produced no value, or is a network operation whose
 * result was no longer kept when this one was submitted (config
 * "history_values"; fq_op_dependency() tells these apart). */
json_t *fq_op_dependency_result(const fq_op *op, fq_op_id dep);

/* The whole result of a dependency named in "depends_on" — status, error,
 * value and, for a request, HTTP status, headers and body. BORROWED: valid
 * until this operation finishes. NULL if `dep` is not one of them. */
const fq_result *fq_op_dependency(const fq_op *op, fq_op_id dep);

/* ------------------------------------------------------------------ */
/* Controlling operations                                               */
/* ------------------------------------------------------------------ */

/* Cancels one operation. Not started yet: it ends FQ_CANCELLED at once (its
 * callback is queued for delivery). Started and still waiting for a worker
 * thread (config "workers"): it ends FQ_CANCELLED without its body running,
 * when a worker takes it up. Running: block and async bodies see
 * fq_op_is_cancelled() and end FQ_CANCELLED when they return/finish; network
 * operations are aborted at once. FQ_ERR_NOT_FOUND if it already finished
 * otherwise or never existed. Cancelling an operation that was already
 * cancelled (by a cancel, not by a failed dependency) returns FQ_OK while the
 * engine remembers it (see config "history"), so cancelling twice is
 * harmless. */
int fq_cancel(fq_engine *engine, fq_op_id id);

/* Where an operation stands, as fq_state() reports it (like NSOperation's
 * isReady, isExecuting, isFinished and isCancelled). */
typedef enum fq_op_state {
    FQ_STATE_WAITING = 1,   /* waits for a dependency or a barrier */
    FQ_STATE_READY = 2,     /* could start: waits for a place (max_concurrent,
                               max_per_host, a rate limit), its queue's resume,
                               its next attempt's time, or a transfer it shares */
    FQ_STATE_RUNNING = 3,   /* started and not ended */
    FQ_STATE_SUCCEEDED = 4, /* ended: its callback may not have returned yet */
    FQ_STATE_FAILED = 5,
    FQ_STATE_CANCELLED = 6
} fq_op_state;

/* Returns where operation `id` stands now, one of fq_op_state's values (> 0),
 * or a negative status: FQ_ERR_NOT_FOUND for an id the engine never gave
 * out, or one that ended longer ago than config "history" remembers (with
 * "history": 0, every ended one), FQ_ERR_INVALID for a NULL engine. Every
 * operation whose submit returned before the call is seen. Counted as in
 * fq_engine_stats: WAITING and READY are "queued" (an operation sharing a
 * coalesced GET's transfer stays READY until that transfer ends, one
 * between two attempts is READY until its next attempt starts), RUNNING is
 * "running". The answer may be out of date as soon as it returns: an
 * operation may start or end meanwhile; the completion callback is what
 * says it ended. May be called from any thread, callbacks and operation
 * bodies included. */
int fq_state(fq_engine *engine, fq_op_id id);

/* Waits until operation `id` has ended and its callback has returned (like
 * NSOperation's waitUntilFinished, and also for the callback, so that what it
 * stored can be read). timeout_ms < 0 waits forever. Returns FQ_OK (at once
 * when both already happened), FQ_ERR_TIMEOUT, FQ_ERR_NOT_FOUND for an id
 * that fq_state() does not know at the call (never given out, or ended
 * longer ago than config "history" remembers), FQ_ERR_INVALID for a NULL
 * engine, FQ_ERR_STATE from a callback or an operation body of the same
 * engine (it could wait for itself). An id known at the call is waited for
 * even if history lets it go meanwhile. An operation of a suspended queue is
 * waited for until it is resumed and has run, or the timeout. Callbacks run
 * one at a time in the order operations ended, so the wait may also cover
 * callbacks of operations that ended before this one (not of those that
 * ended after it, while history remembers it). In poll mode it runs the callbacks waiting on the
 * calling thread while it waits, as fq_queue_wait(), unless the callback
 * has returned already. */
int fq_wait(fq_engine *engine, fq_op_id id, int timeout_ms);

/* Cancels every unfinished operation whose "group" is `group`. Returns how
 * many were cancelled (>= 0) or a negative status. */
int fq_cancel_group(fq_engine *engine, const char *group);

/* Cancels every unfinished operation of the engine. Returns how many. */
int fq_cancel_all(fq_engine *engine);

/* Changes the priority of an operation that has not started (same values as
 * the "priority" option, as a number). FQ_ERR_STATE once it has started,
 * FQ_ERR_NOT_FOUND once it has finished (a cancelled one included). An
 * operation moved to another level joins it behind those already waiting
 * there; moved back to its first level (the one it was submitted at, or had
 * when fq_add_dependency last made it wait), it takes its old place again
 * (the place it had there when it became ready), unless an operation that
 * was behind that place started meanwhile: then it joins that level behind
 * those waiting there. */
int fq_set_priority(fq_engine *engine, fq_op_id id, int priority);

/* Makes `op` also wait for `dep` (like NSOperation's addDependency, except
 * that a `dep` that fails or is cancelled cancels `op`, as in "depends_on";
 * docs/c-api.md, "Coming from NSOperationQueue"). `op`
 * must not have started (FQ_ERR_STATE; FQ_ERR_NOT_FOUND once it has
 * finished, a cancelled one included), nor share another operation's
 * transfer (a coalesced GET that is not the first caller: FQ_ERR_STATE, the
 * message says so); FQ_ERR_CYCLE if `dep` already waits,
 * directly or not, for `op` (or dep == op); FQ_ERR_NOT_FOUND for an unknown
 * id. A `dep` that already finished is treated as in "depends_on". A ready
 * operation given an unfinished `dep` gives up its place in its queue: when
 * `dep` ends it is ready again, behind those that became ready before it,
 * and it ages from then, as one submitted with "depends_on" would. For a
 * search-all, its queries not started yet wait for an unfinished `dep` too
 * (those already sent, or sharing another GET's transfer, go on). */
int fq_add_dependency(fq_engine *engine, fq_op_id op, fq_op_id dep);

/* Makes `op` no longer wait for `dep` (like NSOperation's removeDependency):
 * a dependency given with "depends_on" or fq_add_dependency. `op` must not
 * have started (FQ_ERR_STATE, also once it has finished, a cancelled one
 * included). An unfinished `dep` no longer holds `op` back
 * (and its failure no longer cancels `op`); a `dep` that already succeeded no
 * longer passes its result (fq_op_dependency_result). An operation left waiting
 * for nothing is ready at once, behind those that became ready before it,
 * and ages from then. For a search-all, its queries waiting for `dep` no
 * longer do either. FQ_ERR_NOT_FOUND for an unknown id or when `op` does
 * not depend on `dep`; FQ_ERR_STATE for what is not a dependency of its own:
 * the wait for a barrier of its queue, a wait only through others (a
 * barrier, or a dependency of a dependency), a search-all's own queries, a
 * coalesced GET that shares another operation's transfer. */
int fq_remove_dependency(fq_engine *engine, fq_op_id op, fq_op_id dep);

/* ------------------------------------------------------------------ */
/* Results (inside a completion callback)                               */
/* ------------------------------------------------------------------ */

fq_op_id fq_result_op_id(const fq_result *result);
fq_outcome fq_result_outcome(const fq_result *result);
/* FQ_OK when the operation succeeded, else the reason as an fq_status. */
int fq_result_status(const fq_result *result);
/* A message saying why it failed or was cancelled; NULL on success.
 * BORROWED: valid during the callback. */
const char *fq_result_error(const fq_result *result);
/* The operation's value: a block's return value, an async op's finish
 * value, a parsed response, a search's {"query","items","count"}. BORROWED:
 * valid during the callback (json_incref it to keep it). NULL if none.
 * A request submitted with "lazy_parse" parses its body on the first call
 * (on the calling thread; later calls, from any thread, return the same
 * value). */
json_t *fq_result_value(const fq_result *result);

/* Whether fq_result_value() would return a value, without parsing the body
 * of a "lazy_parse" request. */
bool fq_result_has_value(const fq_result *result);

/* Keeps `result` — and everything its accessors hand out, now or later —
 * valid after the callback, body or event that was lent it, until
 * fq_result_release(). Returns `result` (NULL for NULL). For bindings that
 * read parts of a result later: fq_result_headers() and fq_result_metrics()
 * build their objects on first call, so a retained result costs nothing for
 * the parts never read. Thread-safe; each retain needs one release. */
const fq_result *fq_result_retain(const fq_result *result);
/* Drops one retain (NULL is a no-op). Any thread. */
void fq_result_release(const fq_result *result);


/* ------------------------------------------------------------------ */
/* Item store                                                           */
/* ------------------------------------------------------------------ */
/* A SQLite file of JSON items keyed by (collection, id), the same one the
 * search option "store" writes (a collection is a non-empty UTF-8 name: ""
 * is FQ_ERR_INVALID). WAL journal, synchronous=FULL: a crash never
 * loses a committed response. Ids are compared by their canonical JSON text
 * (object members sorted, a real with 17 significant digits as jansson
 * writes it, 0.1 as 0.10000000000000001, so every double has one text;
 * the stored item is written the same way): "1" and 1 differ, and so
 * do 1 and 1.0 (an integer and a real) and 0.0 and -0.0, while 1.0 and 1e0
 * are one id; search-all's de-duplication compares them the same way. (Sorting
 * compares numbers by value: 1 and 1.0 are a tie there.) One store object per file is shared inside the process; every
 * function is safe from any thread. Other processes may use the file at the
 * same time: opening a store set up before and reading it never wait for
 * their writes; a write waits for another's transaction (up to 5 s, tried
 * three times), then fails FQ_ERR_STORE ("database is locked"). When the file at a path was deleted or
 * replaced since it was opened, the next fq_store_open (and the next search
 * with "store") opens the file there now, creating it if needed; handles to
 * the old one still write to it. */

/* Opens (creating if needed) the store at `path`. NULL on error, with a
 * message in errbuf (if not NULL) and fq_last_error(). */
fq_store *fq_store_open(const char *path, char *errbuf, size_t errlen);

/* Releases the handle. NULL is a no-op. */
void fq_store_free(fq_store *store);

/* Every item of `collection` as a NEW array reference, sorted by the JSON
 * Pointer `sort` (NULL: by id) ascending or descending (same order rules as
 * searches). NULL on error (fq_last_error()). */
json_t *fq_store_items(fq_store *store, const char *collection, const char *sort, bool descending);

/* The item whose id is the JSON string `id` (for ids of other types see
 * fq_store_get_json). *item gets a NEW reference, or NULL when there is none
 * (FQ_OK either way). */
int fq_store_get(fq_store *store, const char *collection, const char *id, json_t **item);

/* The same for an id of any JSON type (BORROWED), e.g. a number. */
int fq_store_get_json(fq_store *store, const char *collection, const json_t *id, json_t **item);

/* How many items `collection` holds (>= 0), or a negative status. */
int64_t fq_store_count(fq_store *store, const char *collection);

/* Upserts an array of objects (BORROWED) by the id at the JSON Pointer
 * `id_pointer` (required), in one transaction (all or nothing: an element
 * that is not an object, or that would not read back — a member name with
 * a NUL byte, nesting deeper than jansson's 2048 levels — is FQ_ERR_INVALID
 * and nothing is written). `merge` is "overwrite"
 * or "keep-local" (NULL: overwrite). Items are applied in order: a later
 * item with an id an earlier one had overwrites it (or, keep-local, is kept
 * out) and is counted so. If `report` is not NULL it gets a NEW
 * {"inserted", "updated", "unchanged", "skipped"} object. */
int fq_store_upsert(fq_store *store, const char *collection, const json_t *items,
                    const char *id_pointer, const char *merge, json_t **report);

/* Network operations; other operations give 0 / NULL. All BORROWED: valid
 * during the callback. */

/* The final response's HTTP status (after redirects); 0 unless a whole
 * response arrived (a transfer that failed midway reports 0). */
long fq_result_http_status(const fq_result *result);
/* The response headers as an object: lower-cased names, repeated headers
 * joined with ", ". */
json_t *fq_result_headers(const fq_result *result);
/* The response body, decoded from its Content-Encoding (fetchq asks for
 * what its libcurl decodes: deflate, gzip, br, zstd with Debian 12's; the
 * headers keep the encoded Content-Length and Content-Encoding); *len gets
 * its length (len may be NULL). Not NUL-terminated. NULL with *len = 0 when
 * there is none. */
const unsigned char *fq_result_body(const fq_result *result, size_t *len);
/* With the request option "marshal": the response's value in CPython's
 * marshal format, so that Python's marshal.loads() makes the objects without
 * scanning the JSON text again; *len gets its length (len may be NULL).
 * marshal.loads() of it equals json.loads() of the body: the same types
 * (int, float, str, list, dict, True, False, None), float bits and key
 * order, a repeated key once, in its first place, with its last value. It
 * is written by an engine thread (the transfer thread that received a small
 * response, else a worker), so that a binding's own thread only makes the
 * objects. NULL with *len = 0 without the option, when the body did not
 * parse, or when its value cannot be written that way (nested deeper than
 * 500 levels, a string or array longer than 2^31 - 1): then parse the body.
 * Uses marshal's codes that every CPython since 3.4 reads ('0', 'N', 'F',
 * 'T', 'i', 'l', 'g', 'z', 'a', 'u', '[', '{', 'r'). */
const unsigned char *fq_result_marshal(const fq_result *result, size_t *len);
/* Timing and size: {"queue_wait_ms", "connect_ms", "first_byte_ms",
 * "total_ms" (numbers), "bytes", "redirects", "attempts" (integers),
 * "http_version" (string), "reused_connection", "from_cache" (booleans)}.
 * For a transfer that failed, what was measured before it failed (a timeout's
 * "total_ms", the "redirects" followed; "http_version" "" when no response
 * arrived); zeros for what never started. With retries, the times and sizes
 * are the last attempt's and "attempts" counts them all. An operation that
 * shared another's transfer ("coalesce") reports that transfer's timings and
 * sizes, not its own lifetime; its "queue_wait_ms" is its own wait, from its
 * submit until that transfer started (0 when it joined one already
 * running). NULL for a network
 * operation that ended before a transfer's result (cancelled in its queue or
 * while it waited for a retry, or failed at start). */
json_t *fq_result_metrics(const fq_result *result);
/* true when the response came from the HTTP cache (fresh, or revalidated
 * by a 304): then the body and value are the cached ones. */
bool fq_result_from_cache(const fq_result *result);

#ifdef __cplusplus
}
#endif

#endif /* FETCHQ_H */
