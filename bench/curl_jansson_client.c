/*
 * curl_jansson_client — the P2 anchor: what a careful C programmer writes
 * without fetchq. One thread, one libcurl multi handle, C easy handles reused
 * for N GETs (keep-alive connections), each body parsed with jansson's
 * json_loadb and checked, exactly the work fetchq does for a request with
 * "parse": "json".
 *
 *   curl_jansson_client URL N C [KEY [THREADS]]
 *       GET URL?i=0 .. URL?i=N-1, C at a time; each body must parse to an
 *       object with KEY ("items"); KEY "-" skips the parse (a 200 with a body
 *       counts): what any libcurl client gets at most, for P3. THREADS
 *       (default 1, the anchor) splits the requests and connections over that
 *       many threads, each with its own multi handle: `make bench` runs it with
 *       2 as the ceiling of a client that does nothing else on this 2-core
 *       machine.
 *
 * Prints {"bench":"p2-anchor","n","concurrency","threads","seconds","rate"} on stdout.
 */
#define _GNU_SOURCE
#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    CURL *easy;
    char *buf;
    size_t len, cap;
} slot;

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
    slot *s = ud;
    size_t add = size * n;
    if (s->len + add > s->cap) {
        s->cap = (s->len + add) * 2;
        s->buf = realloc(s->buf, s->cap);
        if (!s->buf) return 0;
    }
    memcpy(s->buf + s->len, p, add);
    s->len += add;
    return add;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One client: its own multi handle, `c` connections, requests `first` ..
 * `first + n - 1`. Each thread of the client runs one. */
typedef struct {
    const char *base, *key;
    long first, n, ok;
    int c, parse;
} client;

static void *run_client(void *arg) {
    client *cl = arg;
    CURLM *multi = curl_multi_init();
    curl_multi_setopt(multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)cl->c);
    slot *slots = calloc((size_t)cl->c, sizeof *slots);
    long next = 0, bad = 0, running_n = 0;
    char url[1024];
    for (int i = 0; i < cl->c && next < cl->n; i++, next++) {
        slot *s = &slots[i];
        s->easy = curl_easy_init();
        curl_easy_setopt(s->easy, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(s->easy, CURLOPT_WRITEDATA, s);
        curl_easy_setopt(s->easy, CURLOPT_PRIVATE, s);
        curl_easy_setopt(s->easy, CURLOPT_NOSIGNAL, 1L);
        snprintf(url, sizeof url, "%s?i=%ld", cl->base, cl->first + next);
        curl_easy_setopt(s->easy, CURLOPT_URL, url);
        curl_multi_add_handle(multi, s->easy);
        running_n++;
    }
    while (running_n > 0) {
        int still;
        curl_multi_perform(multi, &still);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(multi, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            CURL *easy = msg->easy_handle;
            slot *s;
            curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&s);
            long status = 0;
            curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
            int good;
            if (cl->parse) {
                json_error_t err;
                json_t *v = msg->data.result == CURLE_OK && status == 200 ? json_loadb(s->buf, s->len, 0, &err) : NULL;
                good = json_is_object(v) && json_object_get(v, cl->key);
                json_decref(v);
            } else {
                good = msg->data.result == CURLE_OK && status == 200 && s->len > 0;
            }
            if (good) cl->ok++;
            else if (bad++ < 3) fprintf(stderr, "curl_jansson_client: request failed (curl %d, HTTP %ld)\n",
                                        msg->data.result, status);
            s->len = 0;
            curl_multi_remove_handle(multi, easy);
            running_n--;
            if (next < cl->n) {
                snprintf(url, sizeof url, "%s?i=%ld", cl->base, cl->first + next++);
                curl_easy_setopt(easy, CURLOPT_URL, url);
                curl_multi_add_handle(multi, easy);
                running_n++;
            }
        }
        if (running_n > 0) curl_multi_poll(multi, NULL, 0, 1000, NULL);
    }
    for (int i = 0; i < cl->c; i++) {
        if (slots[i].easy) curl_easy_cleanup(slots[i].easy);
        free(slots[i].buf);
    }
    free(slots);
    curl_multi_cleanup(multi);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 6) {
        fprintf(stderr, "usage: curl_jansson_client URL N C [KEY [THREADS]]\n");
        return 2;
    }
    long n = atol(argv[2]);
    int c = atoi(argv[3]);
    int threads = argc == 6 ? atoi(argv[5]) : 1;
    if (n < 1 || c < 1 || threads < 1 || threads > c || threads > 64) {
        fprintf(stderr, "curl_jansson_client: need N >= 1 and 1 <= THREADS <= min(C, 64)\n");
        return 2;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    client clients[64];
    pthread_t tids[64];
    long first = 0;
    for (int t = 0; t < threads; t++) {
        long share = n / threads + (t < n % threads);
        clients[t] = (client){.base = argv[1], .key = argc >= 5 ? argv[4] : "items", .first = first, .n = share,
                              .c = c / threads + (t < c % threads), .parse = argc < 5 || strcmp(argv[4], "-") != 0};
        first += share;
    }
    double t0 = now_s();
    for (int t = 0; t < threads; t++) pthread_create(&tids[t], NULL, run_client, &clients[t]);
    long ok = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tids[t], NULL);
        ok += clients[t].ok;
    }
    double t = now_s() - t0;
    curl_global_cleanup();
    if (ok != n) {
        fprintf(stderr, "curl_jansson_client: %ld of %ld succeeded\n", ok, n);
        return 1;
    }
    printf("{\"bench\":\"p2-anchor\",\"n\":%ld,\"concurrency\":%d,\"threads\":%d,\"seconds\":%.6f,\"rate\":%.3f}\n", n, c,
           threads, t, (double)n / t);
    return 0;
}
