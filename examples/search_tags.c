/*
 * search_tags — search several tags at once with libfetchq, print each
 * result as it arrives, then one merged list, newest first.
 *
 *     search_tags [-n N] BASE_URL [TAG...]
 *
 * BASE_URL is a search server such as the demo server started by
 * `make demo` (http://127.0.0.1:PORT); it must answer
 * BASE_URL/search?q=TAG&rpp=50 with {"results": [{"id", "author", "text",
 * "created_at", "tags"}, ...]}. Without TAGs a few demo tags are searched.
 * -n N shows at most N merged items (default 20; 0 = all).
 *
 * What it shows:
 *   - one engine whose config holds the search endpoint (URL template, where
 *     the results are, the id and sort keys),
 *   - one queue with max_concurrent 2: the searches run two at a time,
 *   - one fq_submit_search() per tag; the completion callback (on the
 *     engine's delivery thread) prints each result as it arrives and keeps
 *     its items (json_incref: the result is only borrowed for the callback),
 *   - fq_engine_wait_idle(), then the merge done here in C with jansson:
 *     de-duplicate by "id", sort by "created_at", newest first.
 *
 * Exit status: 0 when every search succeeded, 1 when one failed, 2 for a
 * usage or setup error.
 *
 * Build:  cc -std=c11 search_tags.c $(pkg-config --cflags --libs fetchq)
 */
#define _POSIX_C_SOURCE 200809L

#include <fetchq.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_CONCURRENT 2
#define RESULTS_PER_PAGE "50"
#define AUTHOR_COLS 29 /* "Chiara Lindqvist (@chiara_12)" */
#define WAIT_MS 120000 /* generous: the engine's own request timeout is 60 s */

static const char *const default_tags[] = {"swift", "rust", "go", "concurrency", "security"};

/* One search, the userdata of its completion callback. */
struct search {
    const char *tag;
    fq_op_id id;
    int status;       /* FQ_OK, or why it failed (submit or result) */
    char *error;      /* malloc'd message when status != FQ_OK */
    json_t *items;    /* NEW reference kept from the result, or NULL */
    double total_ms;  /* from fq_result_metrics, -1 if unknown */
    struct app *app;
};

struct app {
    fq_engine *engine;
    pthread_mutex_t lock; /* guards `arrived` and the searches' result fields */
    int arrived;
    int submitted;
};

/* ---- display helpers (UTF-8 aware, so "José" counts as 4 columns) ---- */

/* Bytes of `s` that hold at most `cols` code points; *used gets how many. */
static size_t utf8_prefix(const char *s, size_t cols, size_t *used)
{
    size_t i = 0, n = 0;
    while (s[i] != '\0' && n < cols) {
        i++;
        while ((s[i] & 0xC0) == 0x80) /* continuation bytes */
            i++;
        n++;
    }
    if (used)
        *used = n;
    return i;
}

static size_t utf8_len(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        if ((*s & 0xC0) != 0x80)
            n++;
    return n;
}

/* Prints `s` in exactly `width` columns: cut with "…" when longer, padded
 * with spaces when shorter (pad == 0: no padding). */
static void put_cell(const char *s, size_t width, int pad)
{
    size_t cols;
    if (utf8_len(s) > width) {
        size_t bytes = utf8_prefix(s, width - 1, &cols);
        fwrite(s, 1, bytes, stdout);
        fputs("\xE2\x80\xA6", stdout); /* … */
        cols++;
    } else {
        fputs(s, stdout);
        cols = utf8_len(s);
    }
    while (pad && cols++ < width)
        putchar(' ');
}

static const char *str_field(const json_t *item, const char *key)
{
    const char *s = json_string_value(json_object_get(item, key));
    return s ? s : "?";
}

/* "2026-02-14T13:32:15Z" -> "2026-02-14 13:32" (other shapes as they are). */
static void put_date(const json_t *item)
{
    const char *d = str_field(item, "created_at");
    if (strlen(d) >= 16 && d[10] == 'T')
        printf("%.10s %.5s", d, d + 11);
    else
        put_cell(d, 16, 1);
}

static void put_tags(const json_t *item)
{
    const json_t *tags = json_object_get(item, "tags");
    size_t i;
    const json_t *t;
    putchar('[');
    json_array_foreach(tags, i, t) {
        if (json_is_string(t))
            printf("%s%s", i ? ", " : "", json_string_value(t));
    }
    putchar(']');
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- the completion callback: runs once per search, as results arrive ---- */

static void queue_counts(fq_engine *engine, long long *running, long long *waiting)
{
    json_t *stats = fq_engine_stats(engine); /* NEW */
    json_t *q = json_object_get(json_object_get(stats, "queues"), "searches");
    *running = json_integer_value(json_object_get(q, "running"));
    *waiting = json_integer_value(json_object_get(q, "queued"));
    json_decref(stats);
}

static void on_search_done(const fq_result *result, void *userdata)
{
    struct search *s = userdata;
    struct app *app = s->app;
    json_t *value = fq_result_value(result);   /* BORROWED for this call */
    json_t *metrics = fq_result_metrics(result);
    double total_ms = metrics ? json_number_value(json_object_get(metrics, "total_ms")) : -1;
    long long running, waiting;
    int n;

    pthread_mutex_lock(&app->lock);
    n = ++app->arrived;
    s->total_ms = total_ms;
    if (fq_result_outcome(result) == FQ_SUCCEEDED) {
        json_t *items = json_object_get(value, "items");
        if (json_is_array(items)) {
            s->status = FQ_OK;
            s->items = json_incref(items); /* keep it past the callback */
        } else {
            s->status = FQ_ERR_PARSE;
            s->error = strdup("the search value has no \"items\" array");
        }
    } else {
        const char *msg = fq_result_error(result);
        s->status = fq_result_status(result);
        s->error = strdup(msg ? msg : "(no message)");
    }
    pthread_mutex_unlock(&app->lock);

    queue_counts(app->engine, &running, &waiting);
    if (s->status == FQ_OK) {
        size_t count = json_array_size(s->items);
        printf("  [%d/%d] %-12s %3zu results  %6.1f ms   (queue now: %lld running, %lld waiting)\n",
               n, app->submitted, s->tag, count, total_ms, running, waiting);
        if (count > 0) {
            const json_t *first = json_array_get(s->items, 0);
            printf("        newest: ");
            put_date(first);
            printf("  ");
            put_cell(str_field(first, "author"), AUTHOR_COLS, 1);
            printf("  ");
            put_cell(str_field(first, "text"), 50, 0);
            putchar('\n');
        }
    } else {
        long http = fq_result_http_status(result);
        printf("  [%d/%d] %-12s %s: %s: %s", n, app->submitted, s->tag,
               fq_result_outcome(result) == FQ_CANCELLED ? "CANCELLED" : "FAILED",
               fq_strerror(s->status), s->error ? s->error : "");
        if (http && s->status != FQ_ERR_HTTP) /* FQ_ERR_HTTP's message names it */
            printf(" (HTTP %ld)", http);
        putchar('\n');
    }
    fflush(stdout);
}

/* ---- merging: de-duplicate by "id", newest "created_at" first ---- */

/* The de-duplication key of an item: its "id" as a string (numbers too). */
static int id_key(const json_t *item, char *buf, size_t len)
{
    const json_t *id = json_object_get(item, "id");
    if (json_is_string(id))
        return snprintf(buf, len, "s:%s", json_string_value(id)) < (int)len;
    if (json_is_integer(id))
        return snprintf(buf, len, "i:%" JSON_INTEGER_FORMAT, json_integer_value(id)) < (int)len;
    return 0;
}

static int newest_first(const void *a, const void *b)
{
    const json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    const char *dx = json_string_value(json_object_get(x, "created_at"));
    const char *dy = json_string_value(json_object_get(y, "created_at"));
    int c;
    if (!dx || !dy) /* items without a date go last */
        c = (dx == NULL) - (dy == NULL);
    else
        c = -strcmp(dx, dy); /* ISO-8601 UTC strings sort as text */
    if (c == 0) {
        char kx[256] = "", ky[256] = "";
        id_key(x, kx, sizeof kx);
        id_key(y, ky, sizeof ky);
        c = strcmp(kx, ky);
    }
    return c;
}

/* Returns a NEW array of the unique items (or NULL when out of memory);
 * *total gets how many items the searches returned in all. */
static json_t *merge(struct search *searches, int n, size_t *total)
{
    json_t *seen = json_object();
    json_t *merged = json_array();
    json_t **sorted = NULL;
    size_t count, i;
    *total = 0;
    if (!seen || !merged)
        goto fail;
    for (int k = 0; k < n; k++) {
        const json_t *item;
        json_array_foreach(searches[k].items, i, item) {
            char key[256];
            (*total)++;
            if (id_key(item, key, sizeof key)) {
                if (json_object_get(seen, key))
                    continue;
                if (json_object_set(seen, key, json_true()) != 0)
                    goto fail;
            } /* an item without a usable id cannot be a duplicate: keep it */
            if (json_array_append(merged, (json_t *)item) != 0)
                goto fail;
        }
    }
    count = json_array_size(merged);
    if (count > 0) {
        sorted = malloc(count * sizeof *sorted);
        if (!sorted)
            goto fail;
        for (i = 0; i < count; i++)
            sorted[i] = json_incref(json_array_get(merged, i));
        qsort(sorted, count, sizeof *sorted, newest_first);
        json_array_clear(merged);
        for (i = 0; i < count; i++)
            json_array_append_new(merged, sorted[i]); /* steals the incref */
        free(sorted);
    }
    json_decref(seen);
    return merged;
fail:
    json_decref(seen);
    json_decref(merged);
    return NULL;
}

static void usage(const char *prog)
{
    fprintf(stderr, "usage: %s [-n N] BASE_URL [TAG...]\n"
                    "  searches BASE_URL/search?q=TAG&rpp=" RESULTS_PER_PAGE
                    " for each TAG, two at a time,\n"
                    "  and prints the merged results, newest first (at most N; 0 = all, default 20)\n",
            prog);
}

int main(int argc, char **argv)
{
    const char *prog = argv[0];
    const char *base = NULL;
    int ntags = 0;
    long limit = 20;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
            char *end;
            errno = 0;
            limit = strtol(argv[++i], &end, 10);
            if (errno || *end || limit < 0)
            {
                ntags = -1;
                break;
            }
        } else if (argv[i][0] == '-') {
            ntags = -1;
            break;
        } else if (!base) {
            base = argv[i];
        } else {
            argv[1 + ntags++] = argv[i]; /* tags gathered in place: argv + 1 */
        }
    }
    if (ntags < 0 || !base || strncmp(base, "http", 4) != 0) {
        usage(prog);
        return 2;
    }
    const char *const *tags = (const char *const *)argv + 1;
    if (ntags == 0) {
        tags = default_tags;
        ntags = (int)(sizeof default_tags / sizeof default_tags[0]);
    }

    if ((fq_version() >> 16) != FQ_VERSION_MAJOR) {
        fprintf(stderr, "%s: built for libfetchq %s but loaded %s\n", prog,
                FQ_VERSION_STRING, fq_version_string());
        return 2;
    }

    /* The engine: the search endpoint lives in its config. */
    size_t blen = strlen(base);
    while (blen > 0 && base[blen - 1] == '/')
        blen--;
    char url[2048];
    if (snprintf(url, sizeof url, "%.*s/search?q={query}&rpp=" RESULTS_PER_PAGE,
                 (int)blen, base) >= (int)sizeof url) {
        fprintf(stderr, "%s: base URL too long\n", prog);
        return 2;
    }
    json_t *config = json_pack("{s:{s:s, s:s, s:s, s:s, s:s}}", "search",
                               "url", url, "results", "/results", "id", "/id",
                               "sort", "/created_at", "order", "desc");
    if (!config) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return 2;
    }
    char err[256];
    fq_engine *engine = fq_engine_new(config, err, sizeof err);
    json_decref(config); /* borrowed by fq_engine_new: ours to release */
    if (!engine) {
        fprintf(stderr, "%s: fq_engine_new: %s\n", prog, err);
        return 2;
    }

    fq_queue *queue = fq_queue_new(engine, "searches", MAX_CONCURRENT);
    if (!queue) {
        fprintf(stderr, "%s: fq_queue_new: %s\n", prog, fq_last_error());
        fq_engine_free(engine);
        return 2;
    }

    struct app app = {.engine = engine, .arrived = 0, .submitted = 0};
    pthread_mutex_init(&app.lock, NULL);
    struct search *searches = calloc((size_t)ntags, sizeof *searches);
    if (!searches) {
        fprintf(stderr, "%s: out of memory\n", prog);
        fq_engine_free(engine);
        return 2;
    }

    printf("libfetchq %s: searching %d tag%s on %s (queue \"searches\", max_concurrent %d)\n",
           fq_version_string(), ntags, ntags == 1 ? "" : "s", base, MAX_CONCURRENT);
    printf("results as they arrive:\n");
    fflush(stdout);

    double started = now_ms();
    app.submitted = ntags; /* read by callbacks: set before the first submit */
    for (int i = 0; i < ntags; i++) {
        struct search *s = &searches[i];
        s->tag = tags[i];
        s->app = &app;
        s->total_ms = -1;
        s->id = fq_submit_search(queue, s->tag, NULL, on_search_done, s);
        if (s->id < 0) {
            /* A failed submit never calls the callback: record it here. */
            pthread_mutex_lock(&app.lock);
            s->status = (int)s->id;
            s->error = strdup(fq_last_error());
            pthread_mutex_unlock(&app.lock);
            fprintf(stderr, "  submit %-12s FAILED: %s: %s\n", s->tag,
                    fq_strerror(s->status), s->error ? s->error : "");
        }
    }

    int rc = fq_engine_wait_idle(engine, WAIT_MS);
    double elapsed = now_ms() - started;
    if (rc != FQ_OK) {
        fprintf(stderr, "%s: fq_engine_wait_idle: %s: %s\n", prog, fq_strerror(rc),
                fq_last_error());
        fq_cancel_all(engine);
        fq_engine_free(engine); /* delivers the outstanding callbacks */
        engine = NULL;
    }

    /* Every callback has returned (wait_idle / engine_free): merge. */
    pthread_mutex_lock(&app.lock);
    int failed = 0;
    for (int i = 0; i < ntags; i++)
        if (searches[i].status != FQ_OK)
            failed++;
    size_t total = 0;
    json_t *merged = merge(searches, ntags, &total);
    pthread_mutex_unlock(&app.lock);

    if (!merged) {
        fprintf(stderr, "%s: out of memory while merging\n", prog);
        failed = ntags;
    } else {
        size_t count = json_array_size(merged);
        size_t shown = (limit == 0 || (size_t)limit > count) ? count : (size_t)limit;
        printf("\nmerged (de-duplicated by id, newest first): %zu items\n", count);
        for (size_t i = 0; i < shown; i++) {
            const json_t *item = json_array_get(merged, i);
            printf("  ");
            put_date(item);
            printf("  ");
            put_cell(str_field(item, "author"), AUTHOR_COLS, 1);
            printf("  ");
            put_cell(str_field(item, "text"), 44, 1);
            printf("  ");
            put_tags(item);
            putchar('\n');
        }
        if (shown < count)
            printf("  ... and %zu older items (-n 0 lists them all)\n", count - shown);
        printf("\n%d search%s: %d succeeded, %d failed; %zu results, %zu unique items; %.0f ms\n",
               ntags, ntags == 1 ? "" : "es", ntags - failed, failed, total, count, elapsed);
    }
    fflush(stdout); /* keep stdout's lines before stderr's when both are piped */
    if (failed > 0) {
        for (int i = 0; i < ntags; i++)
            if (searches[i].status != FQ_OK)
                fprintf(stderr, "%s: search \"%s\" failed: %s: %s\n", prog, searches[i].tag,
                        fq_strerror(searches[i].status),
                        searches[i].error ? searches[i].error : "");
    }

    json_decref(merged);
    for (int i = 0; i < ntags; i++) {
        json_decref(searches[i].items);
        free(searches[i].error);
    }
    free(searches);
    rc = fq_engine_free(engine); /* frees the queue too; NULL is a no-op */
    if (rc != FQ_OK)
        fprintf(stderr, "%s: fq_engine_free: %s\n", prog, fq_strerror(rc));
    pthread_mutex_destroy(&app.lock);
    fflush(stdout);
    return failed > 0 || rc != FQ_OK ? 1 : 0;
}
