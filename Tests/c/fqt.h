/* Helpers shared by the fetchq C tests: engines from JSON text, a completion
 * recorder, bounded waiting, a global sequence for ordering assertions. */
#ifndef FQ_FQT_H
#define FQ_FQT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
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

#endif
