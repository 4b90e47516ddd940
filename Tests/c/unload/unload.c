/* A host that loads libfetchq with dlopen and unloads it with dlclose, as a
 * plugin host does (found by the fourth review, twenty-seventh session):
 *
 * 1. A thread of the host that called a failing fq_ function (which keeps
 *    its fq_last_error message in thread-specific data) exits after the
 *    dlclose: the key's destructor must still be there (SIGSEGV before).
 * 2. 600 rounds of dlopen, an engine and a failing call, dlclose: each
 *    round took a thread-specific key for good, and once the process had
 *    none left the message was written through someone else's key.
 * 3. jansson, used by the host after the unload, still allocates and frees.
 *
 * Usage: unload PATH-TO-libfetchq.so.0. Prints "N passed, N failed". */
#include <dlfcn.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef void *(*queue_new_fn)(void *, const char *, int);
typedef const char *(*last_error_fn)(void);
typedef void *(*engine_new_fn)(json_t *, char *, size_t);
typedef void (*engine_free_fn)(void *);

static const char *lib_path;
static int passed, failed;

static void check(int ok, const char *what) {
    if (ok) passed++;
    else {
        failed++;
        printf("FAIL %s\n", what);
    }
}

static void *load(void) {
    void *h = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) printf("dlopen: %s\n", dlerror());
    return h;
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int stage; /* 1: the thread called; 2: main unloaded */

static void *failing_caller(void *handle) {
    queue_new_fn queue_new = (queue_new_fn)dlsym(handle, "fq_queue_new");
    last_error_fn last_error = (last_error_fn)dlsym(handle, "fq_last_error");
    int ok = queue_new && last_error && queue_new(NULL, "x", 1) == NULL && last_error()[0] != '\0';
    pthread_mutex_lock(&mu);
    stage = ok ? 1 : -1;
    pthread_cond_broadcast(&cv);
    while (stage != 2) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return NULL; /* thread-specific destructors run here, after the dlclose */
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH-TO-libfetchq.so.0\n", argv[0]);
        return 2;
    }
    lib_path = argv[1];

    void *h = load();
    check(h != NULL, "dlopen");
    if (h == NULL) goto done;
    pthread_t t;
    pthread_create(&t, NULL, failing_caller, h);
    pthread_mutex_lock(&mu);
    while (stage == 0) pthread_cond_wait(&cv, &mu);
    int called = stage == 1;
    pthread_mutex_unlock(&mu);
    check(called, "a failing call sets fq_last_error on the host's thread");
    check(dlclose(h) == 0, "dlclose");
    pthread_mutex_lock(&mu);
    stage = 2;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(t, NULL);
    check(1, "the thread exited after the unload");

    int rounds_ok = 0;
    for (int i = 0; i < 600; i++) {
        void *r = load();
        if (r == NULL) break;
        engine_new_fn engine_new = (engine_new_fn)dlsym(r, "fq_engine_new");
        engine_free_fn engine_free = (engine_free_fn)dlsym(r, "fq_engine_free");
        queue_new_fn queue_new = (queue_new_fn)dlsym(r, "fq_queue_new");
        last_error_fn last_error = (last_error_fn)dlsym(r, "fq_last_error");
        void *e = engine_new && engine_free ? engine_new(NULL, NULL, 0) : NULL;
        int ok = e != NULL && queue_new(NULL, "x", 1) == NULL && strstr(last_error(), "NULL") != NULL;
        if (e) engine_free(e);
        if (dlclose(r) != 0 || !ok) {
            printf("round %d: %s\n", i, ok ? "dlclose failed" : "the failing call left no message");
            break;
        }
        rounds_ok++;
    }
    check(rounds_ok == 600, "600 rounds of dlopen, engine, failing call, dlclose");

    json_t *v = json_pack("{s:[i,i,s]}", "after", 1, 2, "unload");
    char *text = v ? json_dumps(v, JSON_COMPACT) : NULL;
    check(text != NULL && strcmp(text, "{\"after\":[1,2,\"unload\"]}") == 0, "jansson after the unload");
    free(text);
    json_decref(v);
done:
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
