/*
 * store — searches that save their items into the item store (SQLite), then
 * reading the store back.
 *
 *     store BASE_URL STORE_PATH
 *
 * BASE_URL is a search server such as the fetchq test server
 * (Tests/support/testserver.py); it must answer
 * BASE_URL/search?q=TAG&rpp=500 with {"results": [{"id", "created_at", ...}]}.
 * STORE_PATH is the store file, created if needed; the items go to its
 * collection "posts".
 *
 * What it shows:
 *   - the search option "store": {"path", "collection", "merge"}: each
 *     response's items are upserted by "id" in one transaction, and the
 *     search's value gets a "store" report {"inserted", "updated",
 *     "unchanged", "skipped"};
 *   - round 1 with "merge": "overwrite" (server data wins), two searches at
 *     a time writing the same file: tags share items, and no id is inserted
 *     twice;
 *   - round 2, the same searches with "merge": "keep-local": stored items are
 *     kept, so nothing is inserted or updated;
 *   - fq_store_open() + fq_store_count(), fq_store_items() sorted by
 *     "/created_at" newest first, and fq_store_get() for one id.
 *
 * Every number is checked: the exit status is 0 when everything is as
 * described above, 1 when something is not (each difference is printed), 2
 * for a usage or setup error.
 *
 * Build:  cc -std=c11 store.c $(pkg-config --cflags --libs fetchq) -lpthread
 */
#define _POSIX_C_SOURCE 200809L

#include <fetchq.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COLLECTION "posts"
#define MAX_CONCURRENT 2
#define NEWEST 5
#define WAIT_MS 120000 /* generous: the engine's own request timeout is 60 s */

static const char *const tags[] = {"swift", "c", "go", "json"};
#define NTAGS ((int)(sizeof tags / sizeof tags[0]))

/* One search, the userdata of its completion callback. Its fields are
 * written by the callback (delivery thread) and read by main after
 * fq_engine_wait_idle(); `lock` orders the two. */
struct search {
    const char *tag;
    fq_op_id id;
    int status;     /* FQ_OK, or why it failed (submit or result) */
    char *error;    /* malloc'd message when status != FQ_OK */
    json_t *items;  /* NEW reference kept from the result, or NULL */
    json_t *report; /* NEW reference to the value's "store" report, or NULL */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int problems;

static void expect(int ok, const char *fmt, ...)
{
    if (ok)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("store: UNEXPECTED: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    problems++;
}

static json_int_t int_field(const json_t *obj, const char *key)
{
    return json_integer_value(json_object_get(obj, key));
}

static const char *str_field(const json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return s ? s : "?";
}

/* Prints `s` padded to `width` columns, counting UTF-8 code points ("jürgen" is 6). */
static void put_padded(const char *s, size_t width)
{
    size_t cols = 0;
    for (const char *p = s; *p; p++)
        if ((*p & 0xC0) != 0x80)
            cols++;
    fputs(s, stdout);
    while (cols++ < width)
        putchar(' ');
}

static void on_search_done(const fq_result *result, void *userdata)
{
    struct search *s = userdata;
    json_t *value = fq_result_value(result); /* BORROWED for this call */
    pthread_mutex_lock(&lock);
    if (fq_result_outcome(result) == FQ_SUCCEEDED) {
        json_t *items = json_object_get(value, "items");
        json_t *report = json_object_get(value, "store");
        if (json_is_array(items) && json_is_object(report)) {
            s->status = FQ_OK;
            s->items = json_incref(items); /* keep them past the callback */
            s->report = json_incref(report);
        } else {
            s->status = FQ_ERR_PARSE;
            s->error = strdup("the search value has no \"items\" array or no \"store\" report");
        }
    } else {
        const char *msg = fq_result_error(result);
        s->status = fq_result_status(result);
        s->error = strdup(msg ? msg : "(no message)");
    }
    pthread_mutex_unlock(&lock);
}

/* Searches every tag with the given merge policy and waits for all of them.
 * Returns FQ_OK or the status of fq_engine_wait_idle(). */
static int run_round(fq_engine *engine, fq_queue *queue, const char *path, const char *merge,
                     struct search *searches)
{
    json_t *options = json_pack("{s:{s:s, s:s, s:s}}", "store", "path", path,
                                "collection", COLLECTION, "merge", merge);
    for (int i = 0; i < NTAGS; i++) {
        struct search *s = &searches[i];
        s->tag = tags[i];
        s->id = options ? fq_submit_search(queue, s->tag, options, on_search_done, s) : FQ_ERR_NOMEM;
        if (s->id < 0) {
            /* A failed submit never calls the callback: record it here. */
            pthread_mutex_lock(&lock);
            s->status = (int)s->id;
            s->error = strdup(options ? fq_last_error() : "out of memory");
            pthread_mutex_unlock(&lock);
        }
    }
    json_decref(options); /* borrowed by the submits: ours to release */
    return fq_engine_wait_idle(engine, WAIT_MS);
}

/* Prints one round (after every callback returned) and checks each report
 * adds up; returns the sum of "inserted". */
static json_int_t print_round(const char *merge, struct search *searches)
{
    json_int_t inserted = 0;
    printf("\"merge\": \"%s\"\n", merge);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < NTAGS; i++) {
        const struct search *s = &searches[i];
        if (s->status != FQ_OK) {
            printf("  %-6s FAILED: %s: %s\n", s->tag, fq_strerror(s->status), s->error ? s->error : "");
            expect(0, "search \"%s\" (%s) failed: %s", s->tag, merge, s->error ? s->error : "");
            continue;
        }
        const json_t *r = s->report;
        size_t count = json_array_size(s->items);
        printf("  %-6s %3zu items  store: inserted %3" JSON_INTEGER_FORMAT ", updated %3" JSON_INTEGER_FORMAT
               ", unchanged %3" JSON_INTEGER_FORMAT ", skipped %" JSON_INTEGER_FORMAT "\n",
               s->tag, count, int_field(r, "inserted"), int_field(r, "updated"),
               int_field(r, "unchanged"), int_field(r, "skipped"));
        json_int_t sum = int_field(r, "inserted") + int_field(r, "updated") +
                         int_field(r, "unchanged") + int_field(r, "skipped");
        expect(count > 0, "search \"%s\" found nothing", s->tag);
        expect((size_t)sum == count, "\"%s\": the report adds up to %" JSON_INTEGER_FORMAT
               ", the search returned %zu items", s->tag, sum, count);
        expect(int_field(r, "skipped") == 0, "\"%s\": %" JSON_INTEGER_FORMAT " items skipped (no id)",
               s->tag, int_field(r, "skipped"));
        inserted += int_field(r, "inserted");
    }
    pthread_mutex_unlock(&lock);
    fflush(stdout);
    return inserted;
}

static void release_round(struct search *searches)
{
    for (int i = 0; i < NTAGS; i++) {
        json_decref(searches[i].items);
        json_decref(searches[i].report);
        free(searches[i].error);
        searches[i] = (struct search){0};
    }
}

/* Adds the string "id" of every item of `items` to the set `ids`. */
static void add_ids(json_t *ids, const json_t *items)
{
    size_t i;
    const json_t *item;
    json_array_foreach(items, i, item) {
        const char *id = json_string_value(json_object_get(item, "id"));
        if (id)
            json_object_set(ids, id, json_true());
    }
}

int main(int argc, char **argv)
{
    if (argc != 3 || strncmp(argv[1], "http", 4) != 0) {
        fprintf(stderr, "usage: %s BASE_URL STORE_PATH\n"
                        "  searches a few tags with the option \"store\" (collection \"" COLLECTION "\"),\n"
                        "  first with \"merge\": \"overwrite\", then \"keep-local\", and reads the store back\n",
                argv[0]);
        return 2;
    }
    const char *base = argv[1], *path = argv[2];
    if ((fq_version() >> 16) != FQ_VERSION_MAJOR) {
        fprintf(stderr, "store: built for libfetchq %s but loaded %s\n", FQ_VERSION_STRING,
                fq_version_string());
        return 2;
    }

    size_t blen = strlen(base);
    while (blen > 0 && base[blen - 1] == '/')
        blen--;
    char url[2048];
    if (snprintf(url, sizeof url, "%.*s/search?q={query}&rpp=500", (int)blen, base) >= (int)sizeof url) {
        fprintf(stderr, "store: base URL too long\n");
        return 2;
    }
    json_t *config = json_pack("{s:{s:s, s:s, s:s, s:s, s:s}}", "search", "url", url,
                               "results", "/results", "id", "/id", "sort", "/created_at",
                               "order", "desc");
    char err[256];
    fq_engine *engine = config ? fq_engine_new(config, err, sizeof err) : NULL;
    json_decref(config); /* borrowed by fq_engine_new */
    if (!engine) {
        fprintf(stderr, "store: fq_engine_new: %s\n", config ? err : "out of memory");
        return 2;
    }
    fq_queue *queue = fq_queue_new(engine, "searches", MAX_CONCURRENT);
    if (!queue) {
        fprintf(stderr, "store: fq_queue_new: %s\n", fq_last_error());
        fq_engine_free(engine);
        return 2;
    }
    printf("libfetchq %s: searching", fq_version_string());
    for (int i = 0; i < NTAGS; i++)
        printf(" %s", tags[i]);
    printf(" on %s, %d at a time,\nsaving the items to %s (collection \"" COLLECTION "\")\n\n", base,
           MAX_CONCURRENT, path);

    struct search searches[NTAGS] = {{0}};
    json_t *seen = json_object(); /* the distinct ids of round 1 */
    json_t *sample = NULL;        /* one item of round 1, for fq_store_get */
    int rc;

    /* Round 1: server data wins. */
    rc = run_round(engine, queue, path, "overwrite", searches);
    expect(rc == FQ_OK, "fq_engine_wait_idle: %s", fq_strerror(rc));
    json_int_t inserted1 = print_round("overwrite", searches);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < NTAGS; i++)
        add_ids(seen, searches[i].items);
    sample = json_incref(json_array_get(searches[0].items, 0)); /* the newest of tags[0] */
    pthread_mutex_unlock(&lock);
    size_t distinct = json_object_size(seen);
    printf("  %zu distinct ids, %" JSON_INTEGER_FORMAT " inserted\n\n", distinct, inserted1);
    expect(inserted1 >= 0 && (size_t)inserted1 <= distinct,
           "round 1 inserted %" JSON_INTEGER_FORMAT " items but saw only %zu distinct ids", inserted1,
           distinct);
    release_round(searches);

    /* Round 2: the same searches; what is stored stays as it is. */
    rc = run_round(engine, queue, path, "keep-local", searches);
    expect(rc == FQ_OK, "fq_engine_wait_idle: %s", fq_strerror(rc));
    json_int_t inserted2 = print_round("keep-local", searches);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < NTAGS; i++) {
        const json_t *r = searches[i].report;
        if (!r)
            continue;
        expect(int_field(r, "inserted") == 0 && int_field(r, "updated") == 0,
               "keep-local \"%s\": inserted %" JSON_INTEGER_FORMAT ", updated %" JSON_INTEGER_FORMAT
               ", expected 0 and 0", searches[i].tag, int_field(r, "inserted"), int_field(r, "updated"));
    }
    pthread_mutex_unlock(&lock);
    expect(inserted2 == 0, "keep-local inserted %" JSON_INTEGER_FORMAT " items, expected 0", inserted2);
    release_round(searches);

    /* The engine is done: read the store back. */
    rc = fq_engine_free(engine);
    expect(rc == FQ_OK, "fq_engine_free: %s", fq_strerror(rc));

    fq_store *store = fq_store_open(path, err, sizeof err);
    if (!store) {
        fprintf(stderr, "store: fq_store_open(%s): %s\n", path, err);
        json_decref(seen);
        json_decref(sample);
        return 2;
    }
    int64_t count = fq_store_count(store, COLLECTION);
    printf("\nfq_store_count: %" PRId64 " items in \"" COLLECTION "\"\n", count);
    expect(count >= 0 && (size_t)count == distinct,
           "the store holds %" PRId64 " items, round 1 saw %zu distinct ids (%s)", count, distinct,
           count < 0 ? fq_last_error() : "a store file left from another program?");

    json_t *items = fq_store_items(store, COLLECTION, "/created_at", true); /* NEW */
    if (!items) {
        expect(0, "fq_store_items: %s", fq_last_error());
    } else {
        size_t n = json_array_size(items);
        expect(count >= 0 && n == (size_t)count, "fq_store_items gave %zu items, count %" PRId64, n, count);
        printf("the %d newest (fq_store_items sorted by /created_at, descending):\n", NEWEST);
        size_t i;
        json_t *item;
        json_array_foreach(items, i, item) {
            const char *id = str_field(item, "id");
            expect(json_object_get(seen, id) != NULL, "stored item %s was not found by round 1", id);
            if (i > 0)
                expect(strcmp(str_field(json_array_get(items, i - 1), "created_at"),
                              str_field(item, "created_at")) > 0,
                       "fq_store_items: item %zu (%s) is not older than the one before", i, id);
            if (i < NEWEST) {
                printf("  %s  %s  ", str_field(item, "created_at"), id);
                put_padded(str_field(item, "author"), 7);
                printf(" %s\n", str_field(item, "text"));
            }
        }
        json_decref(items);
    }

    /* One item by id: the same document the search returned. */
    const char *sample_id = json_string_value(json_object_get(sample, "id"));
    json_t *got = NULL;
    if (!sample_id) {
        expect(0, "round 1 returned no item with a string id");
    } else {
        rc = fq_store_get(store, COLLECTION, sample_id, &got); /* *got is NEW */
        expect(rc == FQ_OK, "fq_store_get(%s): %s: %s", sample_id, fq_strerror(rc), fq_last_error());
        char *text = got ? json_dumps(got, JSON_COMPACT) : NULL;
        printf("\nfq_store_get(\"%s\"): %s\n", sample_id, text ? text : "(none)");
        free(text);
        expect(got && json_equal(got, sample), "fq_store_get(%s) is not the item the search returned",
               sample_id);
        json_decref(got);
        got = NULL;
    }
    rc = fq_store_get(store, COLLECTION, "no-such-id", &got);
    printf("fq_store_get(\"no-such-id\"): %s\n", rc == FQ_OK && !got ? "none" : "?");
    expect(rc == FQ_OK && got == NULL, "fq_store_get(no-such-id): %s, item %p", fq_strerror(rc),
           (void *)got);
    json_decref(got);

    fq_store_free(store);
    json_decref(seen);
    json_decref(sample);
    printf("\n%s\n", problems ? "store: FAILED (see above)" : "store: everything as expected");
    return problems ? 1 : 0;
}
