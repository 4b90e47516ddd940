/* Helpers shared by the fetchq C tests: engines from JSON text, a completion
 * recorder, bounded waiting, a global sequence for ordering assertions. */
#ifndef FQ_FQT_H
#define FQ_FQT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fetchq.h"
#include "harness.h"

/* Generous deadline for anything that should happen "soon": a test fails
 * instead of hanging, it never relies on it for ordering. */
#define FQT_LONG_MS 20000

long long fqt_now_ms(void);
void fqt_sleep_ms(int ms);

/* Polls `cond` every millisecond until it holds or `ms` (scaled) passed.
 * Evaluates to the final truth of cond. */
#define WAIT_UNTIL(cond, ms)                                                 \
    ({                                                                       \
        long long fqt_deadline_ = fqt_now_ms() + h_scaled_ms(ms);            \
        bool fqt_ok_ = (cond);                                               \
        while (!fqt_ok_ && fqt_now_ms() < fqt_deadline_) {                   \
            fqt_sleep_ms(1);                                                 \
            fqt_ok_ = (cond);                                                \
        }                                                                    \
        fqt_ok_;                                                             \
    })

/* A JSON value parsed from text; REQUIREs that it parses. NEW reference. */
json_t *fqt_json(const char *text);

/* An engine from config text (NULL text = NULL config); REQUIREs success. */
fq_engine *fqt_engine(const char *config_text);
/* A queue; REQUIREs success. */
fq_queue *fqt_queue(fq_engine *e, const char *name, int max_concurrent);
/* Frees the engine and CHECKs that fq_engine_free returned FQ_OK. */
void fqt_engine_free(fq_engine *e);

/* Submits with options given as JSON text (NULL = no options). */
fq_op_id fqt_block(fq_queue *q, fq_block_fn fn, const char *options_text,
                   fq_completion_fn done, void *userdata);
fq_op_id fqt_async(fq_queue *q, fq_async_fn fn, const char *options_text,
                   fq_completion_fn done, void *userdata);

/* The global sequence: strictly increasing stamps to order events across
 * threads. */
long fqt_seq(void);

/* Records what a completion callback saw. Use rec_done as the callback and a
 * rec as its userdata (block/async bodies receive the same pointer). */
typedef struct rec {
    /* written by the test before submitting */
    int tag;
    fq_op_id dep;          /* for bodies that read a dependency */
    void *user;            /* anything else a test needs */
    /* written by bodies */
    atomic_int body_runs;
    atomic_long start_seq; /* fqt_seq() when the body started */
    atomic_long end_seq;   /* fqt_seq() when the body ended */
    _Atomic(fq_op *) op;   /* async: the handle, for finishing later */
    atomic_llong body_id;  /* fq_op_get_id() inside the body */
    pthread_t body_thread;
    /* written by rec_done */
    atomic_int calls;
    fq_op_id id;
    int outcome;
    int status;
    char error[512];
    bool has_error;
    json_t *value;         /* the result value, kept with json_incref */
    pthread_t thread;
    long done_seq;
} rec;

void rec_done(const fq_result *r, void *userdata);
void rec_clear(rec *r); /* releases the kept value */
void rec_clear_all(rec *r, int n);

/* Block body: counts a run, stamps start/end and returns {"tag": r->tag}. */
json_t *body_tag(fq_op *op, void *userdata);
/* Block body: does nothing, returns NULL (userdata may be anything). */
json_t *body_noop(fq_op *op, void *userdata);
/* Async body: finishes at once with no value (userdata may be anything). */
void body_async_finish_now(fq_op *op, void *userdata);
/* Async body: counts a run, stamps start and stores the handle in r->op; a
 * test finishes it later with fqt_finish_in_thread or fq_op_finish. */
void body_async_capture(fq_op *op, void *userdata);

/* Calls fq_op_finish(op, value, error) on a new thread and joins it. The
 * value is STOLEN. Returns fq_op_finish's result. */
int fqt_finish_in_thread(fq_op *op, json_t *value, const char *error);

/* Reads an integer field of a JSON object, or `dflt` if absent. */
long long fqt_int(const json_t *obj, const char *key, long long dflt);
/* stats["queues"][queue][key], or dflt. */
long long fqt_qstat(fq_engine *e, const char *queue, const char *key, long long dflt);
/* stats[key], or dflt. */
long long fqt_stat(fq_engine *e, const char *key, long long dflt);

/* true if `msg` contains `id` written in decimal as a whole number (not as
 * part of a longer digit run). */
bool fqt_names_id(const char *msg, long long id);

#define CHECK_OK(expr) CHECK_EQ_INT((expr), FQ_OK)

/* ------------------------------------------------------------------ */
/* The test server (Tests/support/testserver.py) and plain HTTP        */
/* ------------------------------------------------------------------ */

/* Network tests start ONE server per test, inside the test (each test runs in
 * its own forked child, so a server never outlives or is shared between
 * tests): fqt_server_start() spawns
 *   python3 -B <root>/Tests/support/testserver.py --port 0 --port-file F
 *           --parent-pid <this test's pid> --max-seconds 600 [--files DIR]
 * (stdout on /dev/null; stderr in an unlinked file that fqt_server_stop()
 * shows as notes only when the test has failed), waits at most 20 s (scaled)
 * for the port file, then removes it. fqt_server_stop() ends the server by
 * its pid: SIGTERM, a bounded wait, SIGKILL. If a test dies before stopping
 * it (REQUIRE, timeout, crash), the server sees its --parent-pid gone and
 * exits within 0.5 s; nothing is left on disk.
 *
 * The repository root is $FQ_REPO_ROOT if set, else the nearest ancestor of
 * the harness binary (/proc/self/exe), else of the working directory, that
 * holds Tests/support/testserver.py. */
typedef struct fqt_server {
    int pid;            /* the server's pid; 0 when not running */
    int port;
    char base[64];      /* "http://127.0.0.1:<port>" */
    char dir[128];      /* temporary directory of the port file (while starting) */
    int err_fd;         /* the server's stderr (an unlinked file), -1 if none */
} fqt_server;

/* The repository root (static storage); REQUIREs that it is found. */
const char *fqt_repo_root(void);
/* nst/JSONTestSuite's test_parsing directory: $FQ_JSONTESTSUITE if set, else
 * <repo root>/../shared/data/JSONTestSuite/test_parsing. NULL (with a FAILF)
 * when that is not a directory. Static storage. */
const char *fqt_jsontestsuite_dir(void);

/* Starts the server (files_dir may be NULL); REQUIREs that it comes up. */
void fqt_server_start(fqt_server *s, const char *files_dir);
/* Stops it; harmless when not running. */
void fqt_server_stop(fqt_server *s);
/* "<base><path>" into buf (static-size helper for URLs). */
const char *fqt_url(const fqt_server *s, const char *path, char *buf, size_t len);
/* A GET request's JSON text, {"url": "<base><path>"}, into buf; returns buf. */
const char *fqt_get_request(const fqt_server *s, const char *path, char *buf, size_t len);

/* A plain HTTP/1.1 GET over its own socket (Connection: close; 10 s receive
 * timeout, scaled), independent of the library. Returns the status (> 0) or
 * -1; *body (malloc'ed, NUL-terminated; may be NULL) gets the body. */
int fqt_http_get(int port, const char *target, char **body, size_t *len);
/* GET target, REQUIREs a 200 with a JSON body; NEW reference. */
json_t *fqt_server_json(const fqt_server *s, const char *target);
/* GET /stats (NEW reference) and POST-equivalent GET /stats/reset. */
json_t *fqt_server_stats(const fqt_server *s);
void fqt_server_reset(const fqt_server *s);
/* stats[key] as an integer (-1 when absent). */
long long fqt_server_stat(const fqt_server *s, const char *key);

/* A TCP port on 127.0.0.1 that nothing listens on (bound, then closed). */
int fqt_closed_port(void);

/* RFC 3986 percent-encoding of every byte but A-Z a-z 0-9 - . _ ~ (uppercase
 * hex) into buf; returns buf. */
const char *fqt_pct(const char *text, char *buf, size_t len);

/* fq_submit_request with request and options given as JSON text. */
fq_op_id fqt_request(fq_queue *q, const char *request_text, const char *options_text,
                     fq_completion_fn done, void *userdata);

/* What a network completion saw, beyond rec: use net_done as the callback
 * and a netrec as its userdata. Only the first call is recorded. */
typedef struct netrec {
    rec r;              /* first: rec_done sees the userdata as a rec */
    long http_status;
    json_t *headers;    /* kept (incref), NULL if none */
    json_t *metrics;    /* kept (incref), NULL if none */
    unsigned char *body; /* malloc'ed copy (NUL-terminated), NULL if none */
    size_t body_len;
    bool from_cache;    /* fq_result_from_cache() */
    bool has_value;     /* fq_result_has_value(), read before fq_result_value() */
    unsigned char *marshal; /* malloc'ed copy of fq_result_marshal(), NULL if none */
    size_t marshal_len;
} netrec;

void net_done(const fq_result *res, void *userdata);
void netrec_clear(netrec *n);

#endif
