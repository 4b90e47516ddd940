/*
 * pipeline — data passing down a chain of dependent operations:
 * download -> parse -> save -> notify.
 *
 *     pipeline BASE_URL STORE_PATH
 *
 * BASE_URL is the fetchq test server (Tests/support/testserver.py); it must
 * answer BASE_URL/corpus?tag=swift with {"count": n, "results": [{"id",
 * "author", "text", "created_at", "tags"}, ...]} and BASE_URL/status/500 with
 * a 500. STORE_PATH is an item store (SQLite) file, created if needed; the
 * items go to its collection "posts".
 *
 * What it shows:
 *   - stage 1, download: fq_submit_request() with "parse": "none", so the
 *     engine keeps the raw bytes and does not parse them;
 *   - stage 2, parse (a block operation, "depends_on": [download]): reads the
 *     download through fq_op_dependency() + fq_result_body(), parses it here
 *     with json_loadb() and returns a new array (id, author, created_at, text
 *     and an added "words" count) — a custom parse step written in C;
 *   - stage 3, save ("depends_on": [parse]): reads that array with
 *     fq_op_dependency_result() and upserts it into the store opened once in
 *     main (fq_store_open; fq_store_upsert with a NULL merge = overwrite); its
 *     value is the upsert report;
 *   - stage 4, notify ("depends_on": [save]): prints a summary from the report;
 *   - the download runs on a "downloads" queue and the three steps on a
 *     "steps" queue: dependencies cross queues;
 *   - a second chain whose download fails (BASE_URL/status/500): the three
 *     steps after it end FQ_CANCELLED with FQ_ERR_DEPENDENCY and a message
 *     naming the operation they waited for, and their bodies never run;
 *   - at the end, fq_store_count() / fq_store_items() show that the store
 *     holds exactly the items of the first chain.
 *
 * Every outcome is checked: the exit status is 0 when everything happened as
 * described above, 1 when something did not (each difference is printed),
 * 2 for a usage or setup error.
 *
 * Build:  cc -std=c11 pipeline.c $(pkg-config --cflags --libs fetchq) -lpthread
 */
#define _POSIX_C_SOURCE 200809L

#include <fetchq.h>

#include <ctype.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COLLECTION "posts"
#define TAG "swift"
#define WAIT_MS 120000 /* generous: the engine's own request timeout is 60 s */

enum stage { DOWNLOAD, PARSE, SAVE, NOTIFY, NSTAGES };
static const char *const stage_names[NSTAGES] = {"download", "parse", "save", "notify"};

struct chain;

/* One stage: the userdata of its body and of its completion callback. The
 * fields below `id` are written by the body and the callback, under `lock`. */
struct step {
    struct chain *chain;
    enum stage stage;
    fq_op_id id;       /* what the submit returned (written by main) */
    fq_op_id result_id; /* what the callback saw (fq_result_op_id) */
    int ran;           /* how many times the body ran (block stages) */
    int calls;         /* how many times the completion callback ran */
    fq_outcome outcome;
    int status;
    char *error;       /* malloc'd copy of fq_result_error(), or NULL */
    long http_status;  /* the download's HTTP status */
    size_t body_bytes; /* the download's raw body length */
};

struct chain {
    const char *name;
    char url[2048];
    fq_store *store;
    struct step steps[NSTAGES];
    /* Written by the bodies and callbacks, under `lock`: */
    size_t downloaded; /* items in the download (counted by the parse step) */
    size_t bytes;      /* raw bytes the parse step read */
    json_t *ids;       /* NEW: {"<id>": true} for every downloaded item */
    json_t *report;    /* NEW: the save step's value, kept by its callback */
};

/* Guards the fields of every step and chain written from the library's
 * threads (worker threads run the bodies, the delivery thread the callbacks). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- stage 2: parse the raw download here, in C ---- */

static size_t count_words(const char *s)
{
    size_t n = 0;
    int in_word = 0;
    for (; *s; s++) {
        int space = isspace((unsigned char)*s);
        if (!space && !in_word)
            n++;
        in_word = !space;
    }
    return n;
}

/* Fails the operation with a formatted message; returns NULL for the body. */
static json_t *fail(fq_op *op, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fq_op_set_error(op, msg);
    return NULL;
}

static void mark_ran(struct step *st)
{
    pthread_mutex_lock(&lock);
    st->ran++;
    pthread_mutex_unlock(&lock);
}

static json_t *parse_step(fq_op *op, void *userdata)
{
    struct step *st = userdata;
    struct chain *c = st->chain;
    mark_ran(st);

    /* The whole result of the download: status, headers, raw body. BORROWED
     * until this operation finishes. */
    const fq_result *dl = fq_op_dependency(op, c->steps[DOWNLOAD].id);
    if (!dl)
        return fail(op, "the download #%" PRId64 " is not a dependency", c->steps[DOWNLOAD].id);
    if (fq_result_value(dl) != NULL)
        return fail(op, "\"parse\": \"none\" should leave the download unparsed");
    size_t len = 0;
    const unsigned char *body = fq_result_body(dl, &len);
    if (!body)
        return fail(op, "the download has no body");

    json_error_t jerr;
    json_t *doc = json_loadb((const char *)body, len, 0, &jerr); /* NEW */
    if (!doc)
        return fail(op, "the download is not JSON: line %d: %s", jerr.line, jerr.text);
    json_t *results = json_object_get(doc, "results");
    json_t *count = json_object_get(doc, "count");
    if (!json_is_array(results)) {
        json_decref(doc);
        return fail(op, "the download has no \"results\" array");
    }
    if (json_is_integer(count) && (size_t)json_integer_value(count) != json_array_size(results)) {
        json_decref(doc);
        return fail(op, "the download says count %" JSON_INTEGER_FORMAT " but holds %zu items",
                    json_integer_value(count), json_array_size(results));
    }

    /* The transformed array: the fields we keep, plus a word count. */
    static const char *const keep[] = {"id", "author", "created_at", "text"};
    json_t *out = json_array();
    json_t *ids = json_object();
    size_t i;
    json_t *item;
    if (!out || !ids)
        goto nomem;
    json_array_foreach(results, i, item) {
        json_t *rec = json_object();
        if (!rec || json_array_append_new(out, rec) != 0)
            goto nomem;
        for (size_t k = 0; k < sizeof keep / sizeof keep[0]; k++) {
            json_t *v = json_object_get(item, keep[k]);
            if (v && json_object_set(rec, keep[k], v) != 0)
                goto nomem;
        }
        const char *text = json_string_value(json_object_get(item, "text"));
        if (json_object_set_new(rec, "words", json_integer((json_int_t)count_words(text ? text : ""))) != 0)
            goto nomem;
        const char *id = json_string_value(json_object_get(item, "id"));
        if (id && json_object_set(ids, id, json_true()) != 0)
            goto nomem;
    }

    pthread_mutex_lock(&lock);
    c->downloaded = json_array_size(results);
    c->bytes = len;
    json_decref(c->ids);
    c->ids = ids; /* ours now */
    pthread_mutex_unlock(&lock);
    json_decref(doc);
    return out; /* NEW, stolen by the library: the value the save step reads */

nomem:
    json_decref(ids);
    json_decref(out);
    json_decref(doc);
    return fail(op, "out of memory");
}

/* ---- stage 3: save the parsed array into the item store ---- */

static json_t *save_step(fq_op *op, void *userdata)
{
    struct step *st = userdata;
    struct chain *c = st->chain;
    mark_ran(st);

    /* The parse step's value. BORROWED until this operation finishes. */
    json_t *items = fq_op_dependency_result(op, c->steps[PARSE].id);
    if (!json_is_array(items))
        return fail(op, "the parse step #%" PRId64 " produced no array", c->steps[PARSE].id);
    json_t *report = NULL;
    int rc = fq_store_upsert(c->store, COLLECTION, items, "/id", NULL /* overwrite */, &report);
    if (rc != FQ_OK)
        return fail(op, "fq_store_upsert: %s: %s", fq_strerror(rc), fq_last_error());
    return report; /* NEW {"inserted", "updated", "unchanged", "skipped"}, stolen */
}

/* ---- stage 4: finish / notify ---- */

static json_int_t int_field(const json_t *obj, const char *key)
{
    return json_integer_value(json_object_get(obj, key));
}

static json_t *notify_step(fq_op *op, void *userdata)
{
    struct step *st = userdata;
    struct chain *c = st->chain;
    mark_ran(st);

    json_t *report = fq_op_dependency_result(op, c->steps[SAVE].id); /* BORROWED */
    if (!json_is_object(report))
        return fail(op, "the save step #%" PRId64 " produced no report", c->steps[SAVE].id);
    pthread_mutex_lock(&lock);
    size_t downloaded = c->downloaded;
    size_t bytes = c->bytes;
    pthread_mutex_unlock(&lock);
    printf("  notify (#%" PRId64 "): chain \"%s\" done: %zu items (%zu bytes) downloaded, parsed in C,\n"
           "      saved to \"%s\": "
           "inserted %" JSON_INTEGER_FORMAT ", updated %" JSON_INTEGER_FORMAT
           ", unchanged %" JSON_INTEGER_FORMAT ", skipped %" JSON_INTEGER_FORMAT "\n",
           fq_op_get_id(op), c->name, downloaded, bytes, COLLECTION, int_field(report, "inserted"),
           int_field(report, "updated"), int_field(report, "unchanged"), int_field(report, "skipped"));
    fflush(stdout);
    return NULL; /* no value */
}

/* ---- the completion callback of every stage ---- */

static void on_done(const fq_result *result, void *userdata)
{
    struct step *st = userdata;
    const char *msg = fq_result_error(result); /* BORROWED for this call */
    size_t len = 0;
    pthread_mutex_lock(&lock);
    st->calls++;
    st->result_id = fq_result_op_id(result);
    st->outcome = fq_result_outcome(result);
    st->status = fq_result_status(result);
    free(st->error);
    st->error = msg ? strdup(msg) : NULL;
    if (st->stage == DOWNLOAD) {
        st->http_status = fq_result_http_status(result);
        fq_result_body(result, &len);
        st->body_bytes = len;
    } else if (st->stage == SAVE && st->outcome == FQ_SUCCEEDED) {
        json_decref(st->chain->report);
        st->chain->report = json_incref(fq_result_value(result)); /* keep it past the call */
    }
    pthread_mutex_unlock(&lock);
}

/* ---- submitting one chain ---- */

static const fq_block_fn bodies[NSTAGES] = {NULL, parse_step, save_step, notify_step};

/* Submits the four stages; returns 0, or -1 if a submit failed (printed). */
static int submit_chain(struct chain *c, fq_queue *downloads, fq_queue *steps)
{
    for (int s = 0; s < NSTAGES; s++) {
        c->steps[s].chain = c;
        c->steps[s].stage = (enum stage)s;
    }
    /* Nothing starts until the whole chain is wired up and printed. */
    fq_queue_set_suspended(downloads, true);

    json_t *request = json_pack("{s:s, s:s}", "method", "GET", "url", c->url);
    json_t *options = json_pack("{s:s}", "parse", "none"); /* keep the raw bytes */
    fq_op_id id = (request && options)
                      ? fq_submit_request(downloads, request, options, on_done, &c->steps[DOWNLOAD])
                      : FQ_ERR_NOMEM;
    json_decref(request); /* borrowed by the submit: ours to release */
    json_decref(options);
    if (id < 0) {
        fprintf(stderr, "pipeline: submit %s: %s: %s\n", stage_names[DOWNLOAD], fq_strerror((int)id),
                fq_last_error());
        fq_queue_set_suspended(downloads, false);
        return -1;
    }
    pthread_mutex_lock(&lock);
    c->steps[DOWNLOAD].id = id;
    pthread_mutex_unlock(&lock);

    for (int s = PARSE; s < NSTAGES; s++) {
        /* Each step waits for the one before it and reads its result. */
        options = json_pack("{s:[I]}", "depends_on", (json_int_t)c->steps[s - 1].id);
        id = options ? fq_submit_block(steps, bodies[s], options, on_done, &c->steps[s]) : FQ_ERR_NOMEM;
        json_decref(options);
        if (id < 0) {
            fprintf(stderr, "pipeline: submit %s: %s: %s\n", stage_names[s], fq_strerror((int)id),
                    fq_last_error());
            fq_queue_set_suspended(downloads, false); /* the stages already submitted still end */
            return -1;
        }
        pthread_mutex_lock(&lock);
        c->steps[s].id = id;
        pthread_mutex_unlock(&lock);
    }
    printf("chain \"%s\": download #%" PRId64 " -> parse #%" PRId64 " -> save #%" PRId64
           " -> notify #%" PRId64 "\n  GET %s (\"parse\": \"none\")\n",
           c->name, c->steps[DOWNLOAD].id, c->steps[PARSE].id, c->steps[SAVE].id,
           c->steps[NOTIFY].id, c->url);
    fflush(stdout);
    fq_queue_set_suspended(downloads, false);
    return 0;
}

/* ---- checking what happened ---- */

static int problems;

static void expect(int ok, const char *fmt, ...)
{
    if (ok)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("pipeline: UNEXPECTED: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    problems++;
}

static const char *outcome_name(fq_outcome o)
{
    switch (o) {
    case FQ_SUCCEEDED: return "SUCCEEDED";
    case FQ_FAILED: return "FAILED";
    case FQ_CANCELLED: return "CANCELLED";
    }
    return "(none)";
}

/* true if `text` contains the decimal number `id` not touching other digits. */
static int names_id(const char *text, fq_op_id id)
{
    char num[32];
    snprintf(num, sizeof num, "%" PRId64, id);
    size_t n = strlen(num);
    for (const char *p = text ? strstr(text, num) : NULL; p; p = strstr(p + 1, num))
        if ((p == text || !isdigit((unsigned char)p[-1])) && !isdigit((unsigned char)p[n]))
            return 1;
    return 0;
}

/* Prints every stage of a finished chain (all callbacks have returned). */
static void print_chain(const struct chain *c)
{
    for (int s = 0; s < NSTAGES; s++) {
        const struct step *st = &c->steps[s];
        printf("  %-8s #%-3" PRId64 " %-9s", stage_names[s], st->id, outcome_name(st->outcome));
        if (st->status != FQ_OK)
            printf(" %s", fq_strerror(st->status));
        if (s == DOWNLOAD)
            printf(" (HTTP %ld, %zu raw bytes)", st->http_status, st->body_bytes);
        else
            printf(" (body ran %d time%s)", st->ran, st->ran == 1 ? "" : "s");
        if (st->error)
            printf("\n           reason: %s", st->error);
        putchar('\n');
    }
    fflush(stdout);
}

static void check_common(const struct chain *c)
{
    for (int s = 0; s < NSTAGES; s++) {
        const struct step *st = &c->steps[s];
        expect(st->calls == 1, "%s/%s: completion callback ran %d times, expected exactly once",
               c->name, stage_names[s], st->calls);
        expect(st->result_id == st->id, "%s/%s: callback saw id %" PRId64 ", submit returned %" PRId64,
               c->name, stage_names[s], st->result_id, st->id);
    }
}

/* The first chain: every stage succeeded and the data went all the way. */
static void check_good_chain(const struct chain *c)
{
    check_common(c);
    for (int s = 0; s < NSTAGES; s++) {
        const struct step *st = &c->steps[s];
        expect(st->outcome == FQ_SUCCEEDED && st->status == FQ_OK,
               "%s/%s: %s %s (%s), expected SUCCEEDED", c->name, stage_names[s],
               outcome_name(st->outcome), fq_strerror(st->status), st->error ? st->error : "");
        if (s != DOWNLOAD)
            expect(st->ran == 1, "%s/%s: body ran %d times, expected once", c->name,
                   stage_names[s], st->ran);
    }
    expect(c->steps[DOWNLOAD].http_status == 200, "%s/download: HTTP %ld, expected 200", c->name,
           c->steps[DOWNLOAD].http_status);
    expect(c->downloaded > 0, "%s: the download held no items", c->name);
    expect(json_object_size(c->ids) == c->downloaded, "%s: %zu distinct ids in %zu items", c->name,
           json_object_size(c->ids), c->downloaded);
    json_int_t stored = int_field(c->report, "inserted") + int_field(c->report, "updated") +
                        int_field(c->report, "unchanged");
    expect(json_is_object(c->report) && (size_t)stored == c->downloaded &&
               int_field(c->report, "skipped") == 0,
           "%s/save: report stores %" JSON_INTEGER_FORMAT " items (skipped %" JSON_INTEGER_FORMAT
           "), expected %zu and 0",
           c->name, stored, int_field(c->report, "skipped"), c->downloaded);
}

/* The second chain: the download failed; every later stage was cancelled
 * with FQ_ERR_DEPENDENCY naming the operation it waited for, unrun. */
static void check_failed_chain(const struct chain *c)
{
    const struct step *dl = &c->steps[DOWNLOAD];
    check_common(c);
    expect(dl->outcome == FQ_FAILED && dl->status == FQ_ERR_HTTP && dl->http_status == 500,
           "%s/download: %s %s HTTP %ld, expected FAILED %s HTTP 500", c->name,
           outcome_name(dl->outcome), fq_strerror(dl->status), dl->http_status,
           fq_strerror(FQ_ERR_HTTP));
    for (int s = PARSE; s < NSTAGES; s++) {
        const struct step *st = &c->steps[s];
        expect(st->outcome == FQ_CANCELLED && st->status == FQ_ERR_DEPENDENCY,
               "%s/%s: %s %s, expected CANCELLED %s", c->name, stage_names[s],
               outcome_name(st->outcome), fq_strerror(st->status), fq_strerror(FQ_ERR_DEPENDENCY));
        expect(names_id(st->error, c->steps[s - 1].id),
               "%s/%s: reason \"%s\" does not name its dependency #%" PRId64, c->name,
               stage_names[s], st->error ? st->error : "(none)", c->steps[s - 1].id);
        expect(st->ran == 0, "%s/%s: the body ran %d times after its dependency failed", c->name,
               stage_names[s], st->ran);
    }
    expect(c->report == NULL, "%s/save: produced a report", c->name);
}

/* The store holds exactly the items of the first chain. */
static void check_store(fq_store *store, const struct chain *good)
{
    int64_t count = fq_store_count(store, COLLECTION);
    json_t *items = fq_store_items(store, COLLECTION, "/created_at", true); /* NEW, newest first */
    if (count < 0 || !items) {
        expect(0, "reading the store: %s", fq_last_error());
        json_decref(items);
        return;
    }
    printf("store \"%s\": %" PRId64 " items (the first chain downloaded %zu)\n", COLLECTION, count,
           good->downloaded);
    expect((size_t)count == good->downloaded, "the store holds %" PRId64 " items, expected %zu",
           count, good->downloaded);
    expect(json_array_size(items) == (size_t)count, "fq_store_items gave %zu items, count %" PRId64,
           json_array_size(items), count);
    size_t i;
    json_t *item;
    json_array_foreach(items, i, item) {
        const char *id = json_string_value(json_object_get(item, "id"));
        expect(id && json_object_get(good->ids, id), "stored item %zu (id %s) was not downloaded", i,
               id ? id : "?");
        expect(json_is_integer(json_object_get(item, "words")) && !json_object_get(item, "tags"),
               "stored item %s is not the parse step's record", id ? id : "?");
        if (i < 3) {
            const char *when = json_string_value(json_object_get(item, "created_at"));
            const char *text = json_string_value(json_object_get(item, "text"));
            printf("  %s  %-7s  %2" JSON_INTEGER_FORMAT " words  %s\n", when ? when : "?",
                   id ? id : "?", int_field(item, "words"), text ? text : "");
        }
    }
    if (json_array_size(items) > 3)
        printf("  ... and %zu older\n", json_array_size(items) - 3);
    json_decref(items);
}

static void release_chain(struct chain *c)
{
    for (int s = 0; s < NSTAGES; s++)
        free(c->steps[s].error);
    json_decref(c->ids);
    json_decref(c->report);
}

int main(int argc, char **argv)
{
    if (argc != 3 || strncmp(argv[1], "http", 4) != 0) {
        fprintf(stderr, "usage: %s BASE_URL STORE_PATH\n"
                        "  download BASE_URL/corpus?tag=" TAG ", parse it in C, save it to the item\n"
                        "  store STORE_PATH (collection \"" COLLECTION "\"), notify; then a chain whose\n"
                        "  download fails (BASE_URL/status/500)\n",
                argv[0]);
        return 2;
    }
    const char *base = argv[1], *path = argv[2];
    if ((fq_version() >> 16) != FQ_VERSION_MAJOR) {
        fprintf(stderr, "pipeline: built for libfetchq %s but loaded %s\n", FQ_VERSION_STRING,
                fq_version_string());
        return 2;
    }

    size_t blen = strlen(base);
    while (blen > 0 && base[blen - 1] == '/')
        blen--;
    static struct chain good = {.name = TAG}, bad = {.name = "broken"};
    if (snprintf(good.url, sizeof good.url, "%.*s/corpus?tag=" TAG, (int)blen, base) >= (int)sizeof good.url ||
        snprintf(bad.url, sizeof bad.url, "%.*s/status/500", (int)blen, base) >= (int)sizeof bad.url) {
        fprintf(stderr, "pipeline: base URL too long\n");
        return 2;
    }

    /* The store is opened once and shared by every save step (its functions
     * are safe from any thread). */
    char err[256];
    fq_store *store = fq_store_open(path, err, sizeof err);
    if (!store) {
        fprintf(stderr, "pipeline: fq_store_open(%s): %s\n", path, err);
        return 2;
    }
    good.store = bad.store = store;

    fq_engine *engine = fq_engine_new(NULL, err, sizeof err);
    if (!engine) {
        fprintf(stderr, "pipeline: fq_engine_new: %s\n", err);
        fq_store_free(store);
        return 2;
    }
    fq_queue *downloads = fq_queue_new(engine, "downloads", 4);
    fq_queue *steps = downloads ? fq_queue_new(engine, "steps", 2) : NULL;
    if (!steps) {
        fprintf(stderr, "pipeline: fq_queue_new: %s\n", fq_last_error());
        fq_engine_free(engine);
        fq_store_free(store);
        return 2;
    }
    printf("libfetchq %s: pipeline on %s, store %s\n\n", fq_version_string(), base, path);

    int setup = 0, rc;
    /* Chain 1: everything succeeds. */
    if (submit_chain(&good, downloads, steps) != 0)
        setup = 1;
    rc = fq_engine_wait_idle(engine, WAIT_MS);
    expect(rc == FQ_OK, "fq_engine_wait_idle: %s", fq_strerror(rc));
    if (!setup) {
        print_chain(&good);
        check_good_chain(&good);
    }

    /* Chain 2: the download fails, so nothing after it may run. */
    putchar('\n');
    if (!setup && submit_chain(&bad, downloads, steps) != 0)
        setup = 1;
    rc = fq_engine_wait_idle(engine, WAIT_MS);
    expect(rc == FQ_OK, "fq_engine_wait_idle: %s", fq_strerror(rc));
    if (!setup) {
        print_chain(&bad);
        check_failed_chain(&bad);
        putchar('\n');
        check_store(store, &good);
    }

    rc = fq_engine_free(engine); /* frees the queues too; delivers anything outstanding */
    expect(rc == FQ_OK, "fq_engine_free: %s", fq_strerror(rc));
    fq_store_free(store);
    release_chain(&good);
    release_chain(&bad);
    if (setup)
        return 2;
    printf("\n%s\n", problems ? "pipeline: FAILED (see above)" : "pipeline: everything as expected");
    return problems ? 1 : 0;
}
