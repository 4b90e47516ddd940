/*
 * bare_queue — P1's ceiling on this machine: the least a C programmer can
 * write that still runs N no-op tasks on 2 threads. One mutex, one condition
 * variable, a FIFO of malloc'd tasks, 2 worker threads (so at most 2 run at
 * once, like P1's max_concurrent 2). Each task's body counts, as the anchor's
 * BlockOperation does; nothing else: no ids, priorities, dependencies,
 * cancellation, completion callbacks, history or metrics.
 *
 *   bare_queue N
 *
 * Prints {"bench":"p1-bare","n","seconds","submit_seconds","rate"} on stdout.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct task {
    struct task *next;
    void (*body)(void);
} task;

static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_ready = PTHREAD_COND_INITIALIZER, all_done = PTHREAD_COND_INITIALIZER;
static task *head, *tail;
static long unfinished;
static int stopping;
static atomic_long ran;

static void count(void) { atomic_fetch_add_explicit(&ran, 1, memory_order_relaxed); }

static void *worker(void *unused) {
    (void)unused;
    pthread_mutex_lock(&mutex);
    for (;;) {
        while (!head && !stopping) pthread_cond_wait(&work_ready, &mutex);
        if (!head) break;
        task *t = head;
        head = t->next;
        if (!head) tail = NULL;
        pthread_mutex_unlock(&mutex);
        t->body();
        free(t);
        pthread_mutex_lock(&mutex);
        if (--unfinished == 0) pthread_cond_broadcast(&all_done);
    }
    pthread_mutex_unlock(&mutex);
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    long n = argc == 2 ? atol(argv[1]) : 0;
    if (n < 1) {
        fprintf(stderr, "usage: bare_queue N\n");
        return 2;
    }
    pthread_t workers[2];
    for (int i = 0; i < 2; i++) pthread_create(&workers[i], NULL, worker, NULL);
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        task *t = malloc(sizeof *t);
        if (!t) return 1;
        t->next = NULL;
        t->body = count;
        pthread_mutex_lock(&mutex);
        if (tail) tail->next = t;
        else head = t;
        tail = t;
        unfinished++;
        pthread_cond_signal(&work_ready);
        pthread_mutex_unlock(&mutex);
    }
    double t_submit = now_s() - t0;
    pthread_mutex_lock(&mutex);
    while (unfinished > 0) pthread_cond_wait(&all_done, &mutex);
    double t = now_s() - t0;
    stopping = 1;
    pthread_cond_broadcast(&work_ready);
    pthread_mutex_unlock(&mutex);
    for (int i = 0; i < 2; i++) pthread_join(workers[i], NULL);
    if (atomic_load(&ran) != n) {
        fprintf(stderr, "bare_queue: %ld of %ld tasks ran\n", atomic_load(&ran), n);
        return 1;
    }
    printf("{\"bench\":\"p1-bare\",\"n\":%ld,\"seconds\":%.6f,\"submit_seconds\":%.6f,\"rate\":%.1f}\n", n, t,
           t_submit, (double)n / t);
    return 0;
}
