/*
 * jansson_parse — how long jansson takes to parse the benchmark document
 * (the floor under every client in P2-P4 that parses with jansson and hands
 * C a json_t), and how long fetchq's builder takes to make the same value
 * (fqs_json_build, Sources/CFetchQSupport/json_walk.c, compiled in: what
 * the engine runs for a valid body).
 *
 *   jansson_parse FILE N     N x (json_loadb + json_decref) of FILE, then
 *                            N x (fqs_json_build + json_decref)
 *
 * Prints {"bench":"parse","bytes","n","us_per_parse","parses_per_core_s",
 * "us_per_build"}; fails if the two values differ.
 */
#define _GNU_SOURCE
#include <jansson.h>

#include "fq_json.h" /* fqs_json_build */

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: jansson_parse FILE N\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    static char buf[1 << 20];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    long n = atol(argv[2]);
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a); /* CPU time: the machine is shared */
    for (long i = 0; i < n; i++) {
        json_error_t err;
        json_t *v = json_loadb(buf, len, 0, &err);
        if (!v) {
            fprintf(stderr, "jansson_parse: %s\n", err.text);
            return 1;
        }
        json_decref(v);
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    double us = ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / 1e3 / (double)n;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    for (long i = 0; i < n; i++) {
        json_t *v = fqs_json_build((const unsigned char *)buf, len, 2048);
        if (!v) {
            fprintf(stderr, "jansson_parse: fqs_json_build declined the document\n");
            return 1;
        }
        json_decref(v);
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    double us_build = ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / 1e3 / (double)n;
    json_error_t err;
    json_t *reference = json_loadb(buf, len, 0, &err);
    json_t *built = fqs_json_build((const unsigned char *)buf, len, 2048);
    int same = reference && built && json_equal(reference, built);
    json_decref(reference);
    json_decref(built);
    if (!same) {
        fprintf(stderr, "jansson_parse: fqs_json_build and json_loadb disagree on %s\n", argv[1]);
        return 1;
    }
    printf("{\"bench\":\"parse\",\"bytes\":%zu,\"n\":%ld,\"us_per_parse\":%.3f,\"parses_per_core_s\":%.0f,"
           "\"us_per_build\":%.3f}\n",
           len, n, us, 1e6 / us, us_build);
    return 0;
}
