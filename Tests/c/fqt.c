#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fqt.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

long long fqt_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void fqt_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

json_t *fqt_json(const char *text) {
    json_error_t err;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &err);
    if (!j) FAILF("bad JSON in the test itself: %s: %s", text, err.text);
    REQUIRE(j != NULL);
    return j;
}

fq_engine *fqt_engine(const char *config_text) {
    json_t *cfg = config_text ? fqt_json(config_text) : NULL;
    char errbuf[512] = "";
    fq_engine *e = fq_engine_new(cfg, errbuf, sizeof errbuf);
    if (!e) FAILF("fq_engine_new(%s) failed: %s", config_text ? config_text : "NULL", errbuf);
    json_decref(cfg);
    REQUIRE(e != NULL);
    return e;
}

fq_queue *fqt_queue(fq_engine *e, const char *name, int max_concurrent) {
    fq_queue *q = fq_queue_new(e, name, max_concurrent);
    if (!q) FAILF("fq_queue_new(%s, %d) failed: %s", name, max_concurrent, fq_last_error());
    REQUIRE(q != NULL);
    return q;
}

void fqt_engine_free(fq_engine *e) { CHECK_EQ_INT(fq_engine_free(e), FQ_OK); }

fq_op_id fqt_block(fq_queue *q, fq_block_fn fn, const char *options_text,
                   fq_completion_fn done, void *userdata) {
    json_t *o = options_text ? fqt_json(options_text) : NULL;
    fq_op_id id = fq_submit_block(q, fn, o, done, userdata);
    json_decref(o);
    return id;
}

fq_op_id fqt_async(fq_queue *q, fq_async_fn fn, const char *options_text,
                   fq_completion_fn done, void *userdata) {
    json_t *o = options_text ? fqt_json(options_text) : NULL;
    fq_op_id id = fq_submit_async(q, fn, o, done, userdata);
    json_decref(o);
    return id;
}

static atomic_long g_seq;

long fqt_seq(void) { return atomic_fetch_add(&g_seq, 1) + 1; }

void rec_done(const fq_result *res, void *userdata) {
    rec *r = userdata;
    int prior = atomic_load(&r->calls);
    if (prior > 0) {
        FAILF("completion callback called again for op %lld (tag %d): call #%d",
              (long long)fq_result_op_id(res), r->tag, prior + 1);
        atomic_fetch_add(&r->calls, 1);
        return;
    }
    r->id = fq_result_op_id(res);
    r->outcome = (int)fq_result_outcome(res);
    r->status = fq_result_status(res);
    const char *err = fq_result_error(res);
    r->has_error = err != NULL;
    snprintf(r->error, sizeof r->error, "%s", err ? err : "");
    json_t *v = fq_result_value(res);
    r->value = v ? json_incref(v) : NULL;
    r->thread = pthread_self();
    r->done_seq = fqt_seq();
    atomic_fetch_add(&r->calls, 1);
}

void rec_clear(rec *r) {
    json_decref(r->value);
    r->value = NULL;
}

void rec_clear_all(rec *r, int n) {
    for (int i = 0; i < n; i++) rec_clear(&r[i]);
}

json_t *body_tag(fq_op *op, void *userdata) {
    rec *r = userdata;
    atomic_store(&r->start_seq, fqt_seq());
    atomic_store(&r->body_id, (long long)fq_op_get_id(op));
    r->body_thread = pthread_self();
    atomic_fetch_add(&r->body_runs, 1);
    json_t *v = json_pack("{s:i}", "tag", r->tag);
    atomic_store(&r->end_seq, fqt_seq());
    return v;
}

json_t *body_noop(fq_op *op, void *userdata) {
    (void)op;
    (void)userdata;
    return NULL;
}

void body_async_finish_now(fq_op *op, void *userdata) {
    (void)userdata;
    int rc = fq_op_finish(op, NULL, NULL);
    if (rc != FQ_OK) FAILF("fq_op_finish in the start function: %d", rc);
}

void body_async_capture(fq_op *op, void *userdata) {
    rec *r = userdata;
    atomic_store(&r->start_seq, fqt_seq());
    atomic_store(&r->body_id, (long long)fq_op_get_id(op));
    r->body_thread = pthread_self();
    atomic_fetch_add(&r->body_runs, 1);
    atomic_store(&r->op, op);
}

typedef struct {
    fq_op *op;
    json_t *value;
    const char *error;
    int rc;
} finish_args;

static void *finish_thread(void *p) {
    finish_args *a = p;
    a->rc = fq_op_finish(a->op, a->value, a->error);
    return NULL;
}

int fqt_finish_in_thread(fq_op *op, json_t *value, const char *error) {
    finish_args a = {op, value, error, 12345};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, finish_thread, &a) == 0);
    pthread_join(t, NULL);
    return a.rc;
}

long long fqt_int(const json_t *obj, const char *key, long long dflt) {
    json_t *v = json_object_get(obj, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : dflt;
}

long long fqt_qstat(fq_engine *e, const char *queue, const char *key, long long dflt) {
    json_t *s = fq_engine_stats(e);
    long long v = fqt_int(json_object_get(json_object_get(s, "queues"), queue), key, dflt);
    json_decref(s);
    return v;
}

long long fqt_stat(fq_engine *e, const char *key, long long dflt) {
    json_t *s = fq_engine_stats(e);
    long long v = fqt_int(s, key, dflt);
    json_decref(s);
    return v;
}

bool fqt_names_id(const char *msg, long long id) {
    if (!msg) return false;
    char want[32];
    snprintf(want, sizeof want, "%lld", id);
    size_t wl = strlen(want);
    for (const char *p = msg; *p; p++) {
        if (!isdigit((unsigned char)*p)) continue;
        const char *s = p;
        while (isdigit((unsigned char)*p)) p++;
        if ((size_t)(p - s) == wl && strncmp(s, want, wl) == 0) return true;
        if (!*p) break;
    }
    return false;
}

/* ------------------------------------------------------------------ */
/* The test server and plain HTTP                                       */
/* ------------------------------------------------------------------ */

static bool fqt_is_root(const char *dir) {
    char p[PATH_MAX + 64];
    struct stat st;
    snprintf(p, sizeof p, "%s/Tests/support/testserver.py", dir);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Walks up from `start` (a file or directory) to the repository root. */
static bool fqt_find_root_from(const char *start, char *out, size_t outlen) {
    char cur[PATH_MAX];
    snprintf(cur, sizeof cur, "%s", start);
    for (int depth = 0; depth < 64 && cur[0]; depth++) {
        if (fqt_is_root(cur)) {
            snprintf(out, outlen, "%s", cur);
            return true;
        }
        char *slash = strrchr(cur, '/');
        if (!slash) return false;
        if (slash == cur) {
            if (cur[1] == '\0') return false;
            cur[1] = '\0';
        } else {
            *slash = '\0';
        }
    }
    return false;
}

const char *fqt_repo_root(void) {
    static char root[PATH_MAX];
    if (root[0]) return root;
    const char *env = getenv("FQ_REPO_ROOT");
    if (env && *env) {
        if (!fqt_is_root(env))
            FAILF("FQ_REPO_ROOT=%s has no Tests/support/testserver.py", env);
        REQUIRE(fqt_is_root(env));
        snprintf(root, sizeof root, "%s", env);
        return root;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        if (fqt_find_root_from(exe, root, sizeof root)) return root;
    }
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof cwd) && fqt_find_root_from(cwd, root, sizeof root)) return root;
    root[0] = '\0';
    FAILF("repository root not found (no Tests/support/testserver.py above the binary or "
          "the working directory); set FQ_REPO_ROOT");
    h_abort_test();
}

const char *fqt_jsontestsuite_dir(void) {
    static char dir[PATH_MAX + 64];
    const char *env = getenv("FQ_JSONTESTSUITE");
    if (env && *env)
        snprintf(dir, sizeof dir, "%s", env);
    else
        snprintf(dir, sizeof dir, "%s/../shared/data/JSONTestSuite/test_parsing",
                 fqt_repo_root());
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        FAILF("JSONTestSuite directory not found: %s (set FQ_JSONTESTSUITE)", dir);
        return NULL;
    }
    char *real = realpath(dir, NULL);
    if (real) {
        snprintf(dir, sizeof dir, "%s", real);
        free(real);
    }
    return dir;
}

static void fqt_remove_dir(fqt_server *s) {
    if (!s->dir[0]) return;
    char port_file[sizeof s->dir + 16];
    snprintf(port_file, sizeof port_file, "%s/port", s->dir);
    unlink(port_file);
    rmdir(s->dir);
    s->dir[0] = '\0';
}

void fqt_server_start(fqt_server *s, const char *files_dir) {
    memset(s, 0, sizeof *s);
    s->err_fd = -1;
    char script[PATH_MAX + 64];
    snprintf(script, sizeof script, "%s/Tests/support/testserver.py", fqt_repo_root());
    snprintf(s->dir, sizeof s->dir, "/tmp/fqt-server-XXXXXX");
    REQUIRE(mkdtemp(s->dir) != NULL);
    char port_file[sizeof s->dir + 16], err_file[sizeof s->dir + 16];
    snprintf(port_file, sizeof port_file, "%s/port", s->dir);
    snprintf(err_file, sizeof err_file, "%s/stderr", s->dir);
    /* the server's stderr goes to an unlinked file, read back only when the
     * test fails (it has asyncio chatter about clients that went away) */
    s->err_fd = open(err_file, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (s->err_fd >= 0) unlink(err_file);
    char parent[32];
    snprintf(parent, sizeof parent, "%d", (int)getpid());

    const char *argv[16];
    int a = 0;
    argv[a++] = "python3";
    argv[a++] = "-B";
    argv[a++] = script;
    argv[a++] = "--port";
    argv[a++] = "0";
    argv[a++] = "--port-file";
    argv[a++] = port_file;
    argv[a++] = "--parent-pid";
    argv[a++] = parent;
    argv[a++] = "--max-seconds";
    argv[a++] = "600";
    if (files_dir) {
        argv[a++] = "--files";
        argv[a++] = files_dir;
    }
    argv[a] = NULL;

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    if (s->err_fd >= 0) posix_spawn_file_actions_adddup2(&fa, s->err_fd, STDERR_FILENO);
    pid_t pid = 0;
    int rc = posix_spawnp(&pid, "python3", &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        FAILF("posix_spawnp(python3 %s): %s", script, strerror(rc));
        fqt_server_stop(s);
        h_abort_test();
    }
    s->pid = (int)pid;

    long long deadline = fqt_now_ms() + h_scaled_ms(20000);
    for (;;) {
        FILE *f = fopen(port_file, "r");
        if (f) {
            int port = 0;
            bool got = fscanf(f, "%d", &port) == 1;
            fclose(f);
            if (got && port > 0) {
                s->port = port;
                break;
            }
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            s->pid = 0;
            FAILF("the test server exited before writing its port (wait status %d)", status);
            fqt_server_stop(s);
            h_abort_test();
        }
        if (fqt_now_ms() > deadline) {
            FAILF("the test server did not write its port within 20 s");
            fqt_server_stop(s);
            h_abort_test();
        }
        fqt_sleep_ms(10);
    }
    /* The port file was written atomically and is not used again: remove it
     * now, so that nothing is left behind even if the test dies. */
    fqt_remove_dir(s);
    snprintf(s->base, sizeof s->base, "http://127.0.0.1:%d", s->port);
}

void fqt_server_stop(fqt_server *s) {
    if (s->pid > 0) {
        pid_t pid = (pid_t)s->pid;
        kill(pid, SIGTERM);
        long long deadline = fqt_now_ms() + 10000;
        bool reaped = false;
        while (!reaped && fqt_now_ms() < deadline) {
            int status;
            pid_t r = waitpid(pid, &status, WNOHANG);
            if (r == pid || (r < 0 && errno == ECHILD)) reaped = true;
            else fqt_sleep_ms(5);
        }
        if (!reaped) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
        s->pid = 0;
    }
    fqt_remove_dir(s);
    if (s->err_fd >= 0) {
        if (h_failures() > 0 && lseek(s->err_fd, 0, SEEK_SET) == 0) {
            FILE *f = fdopen(dup(s->err_fd), "r");
            if (f) {
                char line[512];
                for (int i = 0; i < 40 && fgets(line, sizeof line, f); i++) {
                    line[strcspn(line, "\n")] = '\0';
                    h_note("server stderr: %s", line);
                }
                fclose(f);
            }
        }
        close(s->err_fd);
        s->err_fd = -1;
    }
}

const char *fqt_url(const fqt_server *s, const char *path, char *buf, size_t len) {
    snprintf(buf, len, "%s%s", s->base, path);
    return buf;
}

const char *fqt_get_request(const fqt_server *s, const char *path, char *buf, size_t len) {
    char url[256];
    snprintf(buf, len, "{\"url\": \"%s\"}", fqt_url(s, path, url, sizeof url));
    return buf;
}

int fqt_http_get(int port, const char *target, char **body, size_t *len) {
    if (body) *body = NULL;
    if (len) *len = 0;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int ms = h_scaled_ms(10000);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    char req[2048];
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n",
                     target, port);
    if (n <= 0 || (size_t)n >= sizeof req) {
        close(fd);
        return -1;
    }
    for (int off = 0; off < n;) {
        ssize_t w = send(fd, req + off, (size_t)(n - off), MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            close(fd);
            return -1;
        }
        off += (int)w;
    }
    size_t cap = 65536, used = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        close(fd);
        return -1;
    }
    for (;;) {
        if (used == cap) {
            if (cap > (size_t)256 << 20) break;
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
        ssize_t r = recv(fd, buf + used, cap - used, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break; /* EOF, or the receive timeout */
        used += (size_t)r;
    }
    close(fd);
    buf[used] = '\0';
    int status = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) status = -1;
    char *sep = strstr(buf, "\r\n\r\n");
    if (status > 0 && sep && body) {
        size_t blen = used - (size_t)(sep + 4 - buf);
        char *b = malloc(blen + 1);
        if (b) {
            memcpy(b, sep + 4, blen);
            b[blen] = '\0';
            *body = b;
            if (len) *len = blen;
        }
    }
    free(buf);
    return status;
}

json_t *fqt_server_json(const fqt_server *s, const char *target) {
    char *body = NULL;
    size_t len = 0;
    int status = fqt_http_get(s->port, target, &body, &len);
    if (status != 200) FAILF("GET %s on the test server: status %d", target, status);
    json_error_t err;
    json_t *j = status == 200 && body ? json_loadb(body, len, 0, &err) : NULL;
    if (status == 200 && !j) FAILF("GET %s: the body is not JSON: %s", target, err.text);
    free(body);
    REQUIRE(j != NULL);
    return j;
}

json_t *fqt_server_stats(const fqt_server *s) { return fqt_server_json(s, "/stats"); }

void fqt_server_reset(const fqt_server *s) { json_decref(fqt_server_json(s, "/stats/reset")); }

long long fqt_server_stat(const fqt_server *s, const char *key) {
    json_t *st = fqt_server_stats(s);
    long long v = fqt_int(st, key, -1);
    json_decref(st);
    return v;
}

int fqt_closed_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = 0;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    socklen_t sl = sizeof sa;
    REQUIRE(getsockname(fd, (struct sockaddr *)&sa, &sl) == 0);
    close(fd);
    return ntohs(sa.sin_port);
}

const char *fqt_pct(const char *text, char *buf, size_t len) {
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p && o + 4 < len; p++) {
        if (isalnum(*p) || *p == '-' || *p == '.' || *p == '_' || *p == '~') {
            buf[o++] = (char)*p;
        } else {
            buf[o++] = '%';
            buf[o++] = hex[*p >> 4];
            buf[o++] = hex[*p & 15];
        }
    }
    buf[o] = '\0';
    return buf;
}

fq_op_id fqt_request(fq_queue *q, const char *request_text, const char *options_text,
                     fq_completion_fn done, void *userdata) {
    json_t *r = fqt_json(request_text);
    json_t *o = options_text ? fqt_json(options_text) : NULL;
    fq_op_id id = fq_submit_request(q, r, o, done, userdata);
    json_decref(r);
    json_decref(o);
    return id;
}

void net_done(const fq_result *res, void *userdata) {
    netrec *n = userdata;
    if (atomic_load(&n->r.calls) == 0) {
        n->http_status = fq_result_http_status(res);
        n->from_cache = fq_result_from_cache(res);
        n->has_value = fq_result_has_value(res);
        json_t *h = fq_result_headers(res);
        n->headers = h ? json_incref(h) : NULL;
        json_t *m = fq_result_metrics(res);
        n->metrics = m ? json_incref(m) : NULL;
        size_t len = 12345;
        const unsigned char *b = fq_result_body(res, &len);
        if (b) {
            n->body = malloc(len + 1);
            if (n->body) {
                memcpy(n->body, b, len);
                n->body[len] = '\0';
            }
            n->body_len = len;
        } else {
            n->body = NULL;
            n->body_len = len; /* the contract: 0 */
        }
        len = 12345;
        const unsigned char *mb = fq_result_marshal(res, &len);
        n->marshal = mb ? malloc(len ? len : 1) : NULL;
        if (n->marshal) memcpy(n->marshal, mb, len);
        n->marshal_len = len; /* the contract: 0 without it */
    }
    rec_done(res, &n->r);
}

void netrec_clear(netrec *n) {
    rec_clear(&n->r);
    json_decref(n->headers);
    json_decref(n->metrics);
    free(n->body);
    free(n->marshal);
    n->headers = n->metrics = NULL;
    n->body = n->marshal = NULL;
}
