/* Secure defaults, re-checked from the outside against the test server:
 *  - only http:// and https:// URLs are accepted (others: FQ_ERR_INVALID at
 *    submit, never called back, nothing sent), and a redirect to another
 *    scheme fails instead of being followed;
 *  - the default caps: 5 redirects are followed and a 6th fails; a 16 MiB
 *    body is fine and 16 MiB + 1 is FQ_ERR_TOO_LARGE;
 *  - TLS certificates and host names are verified by default (a self-signed
 *    certificate made with the openssl CLI: FQ_ERR_TLS), "ca_file" trusts it,
 *    "verify_tls": false skips the check;
 *  - CR/LF cannot reach the request head (header values, names, method,
 *    URL, "user_agent" in config and options);
 *  - Authorization and Cookie headers (and URL credentials) are not sent to
 *    another host or port after a redirect; a same-origin redirect keeps them
 *    (libcurl's rule since 7.83.0, CURLOPT_UNRESTRICTED_AUTH off). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fqt.h"

extern char **environ;

static const char *sname(int st) {
    switch (st) {
    case FQ_OK: return "FQ_OK";
    case FQ_ERR_INVALID: return "FQ_ERR_INVALID";
    case FQ_ERR_TIMEOUT: return "FQ_ERR_TIMEOUT";
    case FQ_ERR_CANCELLED: return "FQ_ERR_CANCELLED";
    case FQ_ERR_HTTP: return "FQ_ERR_HTTP";
    case FQ_ERR_NETWORK: return "FQ_ERR_NETWORK";
    case FQ_ERR_TOO_LARGE: return "FQ_ERR_TOO_LARGE";
    case FQ_ERR_PARSE: return "FQ_ERR_PARSE";
    case FQ_ERR_TLS: return "FQ_ERR_TLS";
    case FQ_ERR_REDIRECT: return "FQ_ERR_REDIRECT";
    default: return fq_strerror(st);
    }
}

/* One request (request and options as jansson values, borrowed), waited for;
 * REQUIREs that it was accepted and called back exactly once. */
static void run_request(fq_engine *e, fq_queue *q, const json_t *req, const json_t *opts,
                        netrec *n) {
    memset(n, 0, sizeof *n);
    fq_op_id id = fq_submit_request(q, req, opts, net_done, n);
    if (id <= 0) {
        char *d = json_dumps(req, JSON_COMPACT);
        FAILF("submit %s: %lld %s", d ? d : "?", (long long)id, fq_last_error());
        free(d);
    }
    REQUIRE(id > 0);
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    REQUIRE(atomic_load(&n->r.calls) == 1);
    CHECK_EQ_INT(n->r.id, id);
}

/* A GET of url with options text (NULL for none). */
static void get(fq_engine *e, fq_queue *q, const char *url, const char *options_text,
                netrec *n) {
    json_t *req = json_pack("{s:s}", "url", url);
    json_t *o = options_text ? fqt_json(options_text) : NULL;
    run_request(e, q, req, o, n);
    json_decref(req);
    json_decref(o);
}

static void expect(const netrec *n, int outcome, int status, long http, const char *what) {
    if (n->r.outcome != outcome || n->r.status != status || n->http_status != http)
        FAILF("%s: outcome %d, %s, HTTP %ld; expected outcome %d, %s, HTTP %ld; error: %s",
              what, n->r.outcome, sname(n->r.status), n->http_status, outcome, sname(status),
              http, n->r.error);
    if (outcome != FQ_SUCCEEDED && !n->r.has_error) FAILF("%s: failed without a message", what);
}

/* ------------------------------------------------------------------ */
/* Schemes                                                              */

TEST(secure_only_http_and_https_urls) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine("{\"cache\": {\"max_bytes\": 0}}");
    fq_queue *q = fqt_queue(e, "q", 2);
    char bad[16][160];
    int nb = 0;
    /* the server's own port where a host is needed: following one of these
     * would show up as a connection on the server */
    snprintf(bad[nb++], sizeof bad[0], "ftp://127.0.0.1:%d/json", s.port);
    snprintf(bad[nb++], sizeof bad[0], "file:///etc/passwd");
    snprintf(bad[nb++], sizeof bad[0], "file://localhost/etc/passwd");
    snprintf(bad[nb++], sizeof bad[0], "gopher://127.0.0.1:%d/_GET%%20/json", s.port);
    snprintf(bad[nb++], sizeof bad[0], "dict://127.0.0.1:%d/x", s.port);
    snprintf(bad[nb++], sizeof bad[0], "telnet://127.0.0.1:%d", s.port);
    snprintf(bad[nb++], sizeof bad[0], "ws://127.0.0.1:%d/json", s.port);
    snprintf(bad[nb++], sizeof bad[0], "127.0.0.1:%d/json", s.port);      /* scheme-less */
    snprintf(bad[nb++], sizeof bad[0], "//127.0.0.1:%d/json", s.port);    /* scheme-relative */
    snprintf(bad[nb++], sizeof bad[0], "localhost/json");
    snprintf(bad[nb++], sizeof bad[0], "/json");
    snprintf(bad[nb++], sizeof bad[0], "http:/127.0.0.1:%d/json", s.port); /* one slash */
    snprintf(bad[nb++], sizeof bad[0], "httpx://127.0.0.1:%d/json", s.port);
    snprintf(bad[nb++], sizeof bad[0], " http://127.0.0.1:%d/json", s.port);
    snprintf(bad[nb++], sizeof bad[0], "%s", "");
    netrec never;
    memset(&never, 0, sizeof never);
    for (int i = 0; i < nb; i++) {
        json_t *req = json_pack("{s:s}", "url", bad[i]);
        fq_op_id id = fq_submit_request(q, req, NULL, net_done, &never);
        if (id != FQ_ERR_INVALID)
            FAILF("fq_submit_request(\"%s\") returned %lld, expected FQ_ERR_INVALID", bad[i],
                  (long long)id);
        else if (fq_last_error()[0] == '\0')
            FAILF("\"%s\": no fq_last_error message", bad[i]);
        json_decref(req);

        /* the same URL as a search endpoint (option "url") */
        char tmpl[sizeof bad + 16];
        snprintf(tmpl, sizeof tmpl, "%s?q={query}", bad[i]);
        json_t *o = json_pack("{s:s}", "url", tmpl);
        id = fq_submit_search(q, "x", o, net_done, &never);
        if (id != FQ_ERR_INVALID)
            FAILF("fq_submit_search with url \"%s\" returned %lld, expected FQ_ERR_INVALID", tmpl,
                  (long long)id);
        json_decref(o);
    }
    /* an engine whose search endpoint is not http(s) */
    {
        char cfg[256], errbuf[256] = "";
        snprintf(cfg, sizeof cfg, "{\"search\": {\"url\": \"ftp://127.0.0.1:%d/{query}\"}}",
                 s.port);
        json_t *c = fqt_json(cfg);
        fq_engine *bad_e = fq_engine_new(c, errbuf, sizeof errbuf);
        json_decref(c);
        if (bad_e) {
            /* accepted at creation: then every search must be refused at submit */
            fq_queue *bq = fqt_queue(bad_e, "b", 1);
            fq_op_id id = fq_submit_search(bq, "x", NULL, net_done, &never);
            if (id != FQ_ERR_INVALID)
                FAILF("engine search url ftp://: fq_submit_search returned %lld, expected "
                      "FQ_ERR_INVALID (or fq_engine_new failing)",
                      (long long)id);
            fqt_engine_free(bad_e);
        } else {
            CHECK(errbuf[0] != '\0');
        }
    }
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&never.r.calls), 0);
    CHECK_EQ_INT(fqt_stat(e, "submitted", -1), 0);
    /* nothing reached the server, not even a connection */
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), 0);
    CHECK_EQ_INT(fqt_server_stat(&s, "connections_total"), 0);

    /* controls: http:// and, case-insensitively (RFC 3986), HTTP:// work */
    netrec n;
    char url[160];
    snprintf(url, sizeof url, "%s/json?size=10", s.base);
    get(e, q, url, NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, 200, url);
    netrec_clear(&n);
    snprintf(url, sizeof url, "HTTP://127.0.0.1:%d/json?size=20", s.port);
    get(e, q, url, NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, 200, url);
    netrec_clear(&n);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* A redirect to another scheme fails and is not followed: the server sees
 * exactly the one request and one connection, and no file is read. */
TEST(secure_redirect_to_other_schemes_not_followed) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    char targets[6][160];
    int nt = 0;
    snprintf(targets[nt++], sizeof targets[0], "ftp://127.0.0.1:%d/json", s.port);
    snprintf(targets[nt++], sizeof targets[0], "file:///etc/passwd");
    snprintf(targets[nt++], sizeof targets[0], "gopher://127.0.0.1:%d/_GET%%20/json", s.port);
    snprintf(targets[nt++], sizeof targets[0], "dict://127.0.0.1:%d/x", s.port);
    snprintf(targets[nt++], sizeof targets[0], "telnet://127.0.0.1:%d", s.port);
    snprintf(targets[nt++], sizeof targets[0], "scp://127.0.0.1:%d/etc/passwd", s.port);
    for (int i = 0; i < nt; i++) {
        for (int search = 0; search < 2; search++) {
            char enc[256], url[512], what[sizeof targets + 32];
            fqt_pct(targets[i], enc, sizeof enc);
            snprintf(url, sizeof url, "%s/redirect-to?url=%s", s.base, enc);
            snprintf(what, sizeof what, "%s to %s", search ? "search redirected" : "GET redirected",
                     targets[i]);
            fqt_server_reset(&s);
            fq_engine *e = fqt_engine("{\"cache\": {\"max_bytes\": 0}}");
            fq_queue *q = fqt_queue(e, "q", 1);
            netrec n;
            if (!search) {
                get(e, q, url, NULL, &n);
            } else {
                char tmpl[600];
                snprintf(tmpl, sizeof tmpl, "%s&q={query}", url);
                memset(&n, 0, sizeof n);
                json_t *o = json_pack("{s:s}", "url", tmpl);
                fq_op_id id = fq_submit_search(q, "x", o, net_done, &n);
                json_decref(o);
                if (id <= 0) FAILF("%s: submit %lld %s", what, (long long)id, fq_last_error());
                REQUIRE(id > 0);
                CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
                REQUIRE(atomic_load(&n.r.calls) == 1);
            }
            /* a server's redirect is the server's doing: a network failure,
             * not FQ_ERR_INVALID (the caller's request was fine) */
            expect(&n, FQ_FAILED, FQ_ERR_NETWORK, 0, what);
            if (n.body && strstr((const char *)n.body, "root:"))
                FAILF("%s: the body contains /etc/passwd", what);
            if (n.r.value) {
                char *d = json_dumps(n.r.value, JSON_COMPACT);
                if (d && strstr(d, "root:")) FAILF("%s: the value contains /etc/passwd", what);
                free(d);
            }
            CHECK_EQ_INT(fqt_server_stat(&s, "requests"), 1);
            CHECK_EQ_INT(fqt_server_stat(&s, "connections_total"), 1);
            netrec_clear(&n);
            fqt_engine_free(e);
            CHECK(WAIT_UNTIL(fqt_server_stat(&s, "open_connections") == 0, 10000));
        }
    }
    fqt_server_stop(&s);
}

/* ------------------------------------------------------------------ */
/* Default caps (engine with NULL config, no options)                   */

static bool pattern_ok(const netrec *n, size_t want) {
    if (!n->body || n->body_len != want) return false;
    for (size_t i = 0; i < want; i++)
        if (n->body[i] != (unsigned char)(i % 251)) return false;
    return true;
}

TEST(secure_default_redirect_and_size_caps) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 1);
    netrec n;
    char url[160];

    fqt_server_reset(&s);
    snprintf(url, sizeof url, "%s/redirect?n=5", s.base);
    get(e, q, url, NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, 200, "5 redirects with the default max_redirects");
    CHECK_EQ_INT(fqt_int(n.metrics, "redirects", -1), 5);
    CHECK(json_is_array(json_object_get(n.r.value, "items")));
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), 6);
    netrec_clear(&n);

    fqt_server_reset(&s);
    snprintf(url, sizeof url, "%s/redirect?n=6", s.base);
    get(e, q, url, NULL, &n);
    expect(&n, FQ_FAILED, FQ_ERR_REDIRECT, 0, "6 redirects with the default max_redirects");
    /* the first request and 5 followed redirects; the 6th Location is not followed */
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), 6);
    netrec_clear(&n);

    static const struct {
        const char *path;
        size_t n;
        bool ok;
    } sizes[] = {
        {"/bytes?n=16777216", 16777216, true},
        {"/bytes?n=16777216&chunked=1", 16777216, true},
        {"/bytes?n=16777217", 16777217, false},
        {"/bytes?n=16777217&chunked=1", 16777217, false},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        snprintf(url, sizeof url, "%s%s", s.base, sizes[i].path);
        get(e, q, url, NULL, &n);
        if (sizes[i].ok) {
            expect(&n, FQ_SUCCEEDED, FQ_OK, 200, sizes[i].path);
            if (!pattern_ok(&n, sizes[i].n))
                FAILF("%s: body of %zu bytes is not the %zu-byte pattern", sizes[i].path,
                      n.body_len, sizes[i].n);
            CHECK_EQ_INT(fqt_int(n.metrics, "bytes", -1), (long long)sizes[i].n);
            CHECK(n.r.value == NULL); /* application/octet-stream: not parsed */
        } else {
            expect(&n, FQ_FAILED, FQ_ERR_TOO_LARGE, 0, sizes[i].path);
            CHECK(n.body == NULL);
            /* the refused transfer's connection is closed, the engine lives on */
            if (!WAIT_UNTIL(fqt_server_stat(&s, "open_connections") <= 1, 10000))
                FAILF("%s: %lld connections open after TOO_LARGE", sizes[i].path,
                      fqt_server_stat(&s, "open_connections"));
        }
        netrec_clear(&n);
    }
    fqt_engine_free(e);
    CHECK(WAIT_UNTIL(fqt_server_stat(&s, "open_connections") == 0, 10000));
    fqt_server_stop(&s);
}

/* ------------------------------------------------------------------ */
/* TLS                                                                  */

/* Runs argv (argv[0] looked up in PATH) with stdout/stderr into out_file;
 * returns the exit status, 127 when it could not be started. */
static int run_tool(const char *const *argv, const char *out_file) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out_file, O_WRONLY | O_CREAT | O_TRUNC,
                                     0600);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    pid_t pid = 0;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return 127;
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* Shows a tool's output file as notes. */
static void note_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[512];
    for (int i = 0; i < 20 && fgets(line, sizeof line, f); i++) {
        line[strcspn(line, "\n")] = '\0';
        h_note("  %s", line);
    }
    fclose(f);
}

/* A self-signed certificate for 127.0.0.1 (CN and subjectAltName IP), made
 * with the openssl CLI into dir/<name>-cert.pem and dir/<name>-key.pem.
 * Missing openssl is a failure, not a skip: CI installs the "openssl"
 * package. */
static void make_cert(const char *dir, const char *name, char *cert, char *key, size_t len) {
    snprintf(cert, len, "%s/%s-cert.pem", dir, name);
    snprintf(key, len, "%s/%s-key.pem", dir, name);
    char out[PATH_MAX];
    snprintf(out, sizeof out, "%s/openssl.out", dir);
    const char *argv[] = {"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                          "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                          "-days", "1", "-keyout", key, "-out", cert, NULL};
    int rc = run_tool(argv, out);
    if (rc == 127) {
        FAILF("the openssl CLI is not installed (Debian/Ubuntu package \"openssl\"): the TLS "
              "verification test needs it to make a self-signed certificate");
        unlink(out);
        h_abort_test();
    }
    if (rc != 0) {
        FAILF("openssl req -x509 ... exited with %d:", rc);
        note_file(out);
    }
    unlink(out);
    REQUIRE(rc == 0);
}

/* Starts the test server over TLS (same shape as fqt_server_start, which has
 * no TLS arguments); base is "https://127.0.0.1:<port>". Stop it with
 * fqt_server_stop(). */
static void tls_server_start(fqt_server *s, const char *dir, const char *cert, const char *key) {
    memset(s, 0, sizeof *s);
    s->err_fd = -1;
    char script[PATH_MAX + 64], port_file[PATH_MAX], parent[32];
    snprintf(script, sizeof script, "%s/Tests/support/testserver.py", fqt_repo_root());
    snprintf(port_file, sizeof port_file, "%s/port", dir);
    snprintf(parent, sizeof parent, "%d", (int)getpid());
    const char *argv[] = {"python3", "-B", script, "--port", "0", "--port-file", port_file,
                          "--parent-pid", parent, "--max-seconds", "600", "--tls-cert", cert,
                          "--tls-key", key, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    char err_file[PATH_MAX];
    snprintf(err_file, sizeof err_file, "%s/server.err", dir);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err_file, O_WRONLY | O_CREAT | O_TRUNC,
                                     0600);
    pid_t pid = 0;
    int rc = posix_spawnp(&pid, "python3", &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) FAILF("posix_spawnp(python3 %s): %s", script, strerror(rc));
    REQUIRE(rc == 0);
    s->pid = (int)pid;
    long long deadline = fqt_now_ms() + h_scaled_ms(20000);
    while (s->port == 0) {
        FILE *f = fopen(port_file, "r");
        if (f) {
            int port = 0;
            if (fscanf(f, "%d", &port) == 1 && port > 0) s->port = port;
            fclose(f);
        }
        if (s->port) break;
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            s->pid = 0;
            FAILF("the TLS test server exited before writing its port; its stderr:");
            note_file(err_file);
            h_abort_test();
        }
        if (fqt_now_ms() > deadline) {
            FAILF("the TLS test server did not write its port within 20 s; its stderr:");
            note_file(err_file);
            fqt_server_stop(s);
            h_abort_test();
        }
        fqt_sleep_ms(10);
    }
    unlink(port_file);
    unlink(err_file); /* the server keeps writing to it, unlinked */
    snprintf(s->base, sizeof s->base, "https://127.0.0.1:%d", s->port);
}

/* The TLS server's open_connections, read through a fresh engine that trusts
 * cert (a connection carrying only /stats requests is not counted). */
static long long tls_open_connections(const fqt_server *s, const char *cert) {
    char cfg[PATH_MAX + 64], url[128];
    snprintf(cfg, sizeof cfg, "{\"ca_file\": \"%s\", \"cache\": {\"max_bytes\": 0}}", cert);
    snprintf(url, sizeof url, "%s/stats", s->base);
    fq_engine *e = fqt_engine(cfg);
    fq_queue *q = fqt_queue(e, "stats", 1);
    netrec n;
    get(e, q, url, NULL, &n);
    long long v = n.r.outcome == FQ_SUCCEEDED ? fqt_int(n.r.value, "open_connections", -1) : -1;
    if (v < 0) FAILF("GET %s over TLS failed: %s", url, n.r.error);
    netrec_clear(&n);
    fqt_engine_free(e);
    return v;
}

/* Removes the certificate directories (/tmp/fq-tls-<pid>-XXXXXX) of test
 * processes that died before cleaning up (a failed REQUIRE ends a test with
 * _exit). Directories of live processes — a parallel run — are left alone. */
static void remove_stale_cert_dirs(void) {
    DIR *d = opendir("/tmp");
    if (!d) return;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        int pid = 0;
        if (sscanf(ent->d_name, "fq-tls-%d-", &pid) != 1 || pid <= 0) continue;
        if (kill(pid, 0) == 0 || errno != ESRCH) continue;
        char sub[PATH_MAX];
        snprintf(sub, sizeof sub, "/tmp/%s", ent->d_name);
        DIR *sd = opendir(sub);
        if (sd) {
            struct dirent *f;
            while ((f = readdir(sd)) != NULL) {
                if (strcmp(f->d_name, ".") == 0 || strcmp(f->d_name, "..") == 0) continue;
                char file[PATH_MAX + 256];
                snprintf(file, sizeof file, "%s/%s", sub, f->d_name);
                unlink(file);
            }
            closedir(sd);
        }
        rmdir(sub);
    }
    closedir(d);
}

TEST_T(secure_tls_verification_on_by_default, 90) {
    (void)fqt_repo_root(); /* fail before creating anything */
    remove_stale_cert_dirs();
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/fq-tls-%d-XXXXXX", (int)getpid());
    REQUIRE(mkdtemp(dir) != NULL);
    char cert[PATH_MAX], key[PATH_MAX], other_cert[PATH_MAX], other_key[PATH_MAX];
    make_cert(dir, "server", cert, key, sizeof cert);
    make_cert(dir, "other", other_cert, other_key, sizeof other_cert);
    unlink(other_key); /* only its certificate is used */
    fqt_server s;
    tls_server_start(&s, dir, cert, key);
    unlink(key); /* the server has loaded it */
    char url[128], localhost_url[128], cfg[PATH_MAX + 128], opt[PATH_MAX + 64];
    snprintf(url, sizeof url, "%s/json?size=10", s.base);
    snprintf(localhost_url, sizeof localhost_url, "https://localhost:%d/json?size=10", s.port);
    netrec n;

    /* the default config: the self-signed certificate is refused */
    fq_engine *e = fqt_engine(NULL);
    fq_queue *q = fqt_queue(e, "q", 2);
    get(e, q, url, NULL, &n);
    expect(&n, FQ_FAILED, FQ_ERR_TLS, 0, "default config, self-signed certificate");
    CHECK(n.body == NULL && n.r.value == NULL);
    netrec_clear(&n);
    /* a search too */
    {
        char tmpl[160];
        snprintf(tmpl, sizeof tmpl, "%s/search?q={query}", s.base);
        json_t *o = json_pack("{s:s}", "url", tmpl);
        memset(&n, 0, sizeof n);
        REQUIRE(fq_submit_search(q, "swift", o, net_done, &n) > 0);
        json_decref(o);
        CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
        REQUIRE(atomic_load(&n.r.calls) == 1);
        expect(&n, FQ_FAILED, FQ_ERR_TLS, 0, "default config, search over TLS");
        netrec_clear(&n);
    }
    /* option ca_file on the default engine: trusted */
    snprintf(opt, sizeof opt, "{\"ca_file\": \"%s\"}", cert);
    get(e, q, url, opt, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, 200, "option ca_file = the server's certificate");
    CHECK(json_is_array(json_object_get(n.r.value, "items")));
    netrec_clear(&n);
    /* option ca_file = another self-signed certificate: still refused */
    snprintf(opt, sizeof opt, "{\"ca_file\": \"%s\"}", other_cert);
    get(e, q, url, opt, &n);
    expect(&n, FQ_FAILED, FQ_ERR_TLS, 0, "option ca_file = an unrelated certificate");
    netrec_clear(&n);
    /* option verify_tls false */
    get(e, q, url, "{\"verify_tls\": false}", &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, 200, "option verify_tls false");
    netrec_clear(&n);
    /* after all that, the default is still to verify (no state carried over,
     * e.g. by a reused connection or session) */
    get(e, q, url, NULL, &n);
    expect(&n, FQ_FAILED, FQ_ERR_TLS, 0, "default again after trusted requests");
    netrec_clear(&n);
    fqt_engine_free(e);

    /* config ca_file */
    snprintf(cfg, sizeof cfg, "{\"ca_file\": \"%s\"}", cert);
    e = fqt_engine(cfg);
    q = fqt_queue(e, "q", 2);
    get(e, q, url, NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, 200, "config ca_file = the server's certificate");
    netrec_clear(&n);
    /* the host name is verified too: the certificate names IP 127.0.0.1 only */
    get(e, q, localhost_url, NULL, &n);
    expect(&n, FQ_FAILED, FQ_ERR_TLS, 0, "config ca_file, host name localhost not in the cert");
    netrec_clear(&n);
    /* an option overrides the engine's ca_file */
    snprintf(opt, sizeof opt, "{\"ca_file\": \"%s\"}", other_cert);
    get(e, q, url, opt, &n);
    expect(&n, FQ_FAILED, FQ_ERR_TLS, 0, "config ca_file, option ca_file = unrelated cert");
    netrec_clear(&n);
    fqt_engine_free(e);

    /* a ca_file that does not exist: fails, never falls back to no checking */
    snprintf(cfg, sizeof cfg, "{\"ca_file\": \"%s/missing.pem\"}", dir);
    json_t *c = fqt_json(cfg);
    char errbuf[256] = "";
    e = fq_engine_new(c, errbuf, sizeof errbuf);
    json_decref(c);
    if (e) {
        q = fqt_queue(e, "q", 1);
        get(e, q, url, NULL, &n);
        expect(&n, FQ_FAILED, FQ_ERR_TLS, 0, "config ca_file missing");
        netrec_clear(&n);
        fqt_engine_free(e);
    } /* else: refused at creation, also fine */

    /* config verify_tls false */
    e = fqt_engine("{\"verify_tls\": false}");
    q = fqt_queue(e, "q", 2);
    get(e, q, url, NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, 200, "config verify_tls false");
    netrec_clear(&n);
    get(e, q, localhost_url, NULL, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, 200, "config verify_tls false, host name not checked");
    netrec_clear(&n);
    /* and an option turns it back on */
    get(e, q, url, "{\"verify_tls\": true}", &n);
    expect(&n, FQ_FAILED, FQ_ERR_TLS, 0, "config verify_tls false, option verify_tls true");
    netrec_clear(&n);
    fqt_engine_free(e);

    /* nothing left open on the server */
    CHECK(WAIT_UNTIL(tls_open_connections(&s, cert) == 0, 10000));
    fqt_server_stop(&s);
    unlink(cert);
    unlink(other_cert);
    CHECK(rmdir(dir) == 0);
}

/* ------------------------------------------------------------------ */
/* CR/LF injection                                                      */

TEST(secure_crlf_rejected_in_headers_and_user_agent) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    char echo[128];
    snprintf(echo, sizeof echo, "%s/echo", s.base);
    static const char *const evil[] = {"a\r\nX-Injected: 1", "a\nX-Injected: 1",
                                       "a\rX-Injected: 1", "\r\n", "a\r\n\r\nGET / HTTP/1.1"};
    enum { NEVIL = sizeof evil / sizeof evil[0] };

    /* user_agent in the config: fq_engine_new refuses, naming the key */
    for (int i = 0; i < NEVIL; i++) {
        json_t *c = json_pack("{s:s}", "user_agent", evil[i]);
        char errbuf[256] = "";
        fq_engine *bad = fq_engine_new(c, errbuf, sizeof errbuf);
        json_decref(c);
        if (bad) {
            FAILF("fq_engine_new with a CR/LF user_agent (#%d) succeeded", i);
            fqt_engine_free(bad);
        } else {
            CHECK_CONTAINS(errbuf, "user_agent");
        }
    }

    fq_engine *e = fqt_engine("{\"cache\": {\"max_bytes\": 0}}");
    fq_queue *q = fqt_queue(e, "q", 2);
    netrec never;
    memset(&never, 0, sizeof never);
    for (int i = 0; i < NEVIL; i++) {
        /* a header value */
        json_t *req = json_pack("{s:s, s:{s:s}}", "url", echo, "headers", "X-A", evil[i]);
        CHECK_EQ_INT(fq_submit_request(q, req, NULL, net_done, &never), FQ_ERR_INVALID);
        json_decref(req);
        /* a header name */
        req = json_pack("{s:s, s:{s:s}}", "url", echo, "headers", evil[i], "v");
        CHECK_EQ_INT(fq_submit_request(q, req, NULL, net_done, &never), FQ_ERR_INVALID);
        json_decref(req);
        /* the method */
        req = json_pack("{s:s, s:s}", "url", echo, "method", evil[i]);
        CHECK_EQ_INT(fq_submit_request(q, req, NULL, net_done, &never), FQ_ERR_INVALID);
        json_decref(req);
        /* user_agent as a request option and a search option */
        req = json_pack("{s:s}", "url", echo);
        json_t *o = json_pack("{s:s}", "user_agent", evil[i]);
        fq_op_id id = fq_submit_request(q, req, o, net_done, &never);
        if (id != FQ_ERR_INVALID)
            FAILF("option user_agent with CR/LF (#%d): submit returned %lld, expected "
                  "FQ_ERR_INVALID",
                  i, (long long)id);
        else
            CHECK_CONTAINS(fq_last_error(), "user_agent");
        json_decref(o);
        o = json_pack("{s:s, s:s}", "user_agent", evil[i], "url", "http://127.0.0.1:9/?q={query}");
        id = fq_submit_search(q, "x", o, net_done, &never);
        if (id != FQ_ERR_INVALID)
            FAILF("search option user_agent with CR/LF (#%d): submit returned %lld, expected "
                  "FQ_ERR_INVALID",
                  i, (long long)id);
        json_decref(o);
        json_decref(req);
    }
    /* NUL in a header value too (jansson strings may hold it) */
    {
        json_t *req = json_pack("{s:s, s:{s:s#}}", "url", echo, "headers", "X-A", "a\0b",
                                (size_t)3);
        CHECK_EQ_INT(fq_submit_request(q, req, NULL, net_done, &never), FQ_ERR_INVALID);
        json_decref(req);
    }
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    CHECK_EQ_INT(atomic_load(&never.r.calls), 0);
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), 0);
    CHECK_EQ_INT(fqt_server_stat(&s, "connections_total"), 0);

    /* what is allowed arrives as one header each: a query value with CR/LF is
     * percent-encoded, a custom user_agent and header are sent verbatim */
    json_t *req = json_pack("{s:s, s:{s:s}, s:{s:s}}", "url", echo, "headers", "X-Ok", "fine",
                            "query", "x", "a\r\nX-Injected: 1");
    json_t *o = fqt_json("{\"user_agent\": \"secure-test/1.0\"}");
    netrec n;
    run_request(e, q, req, o, &n);
    expect(&n, FQ_SUCCEEDED, FQ_OK, 200, "/echo with an encoded CR/LF query value");
    json_t *h = json_object_get(n.r.value, "headers");
    CHECK_STR(json_string_value(json_object_get(h, "x-ok")), "fine");
    CHECK_STR(json_string_value(json_object_get(h, "user-agent")), "secure-test/1.0");
    CHECK(json_object_get(h, "x-injected") == NULL);
    CHECK_STR(json_string_value(json_object_get(json_object_get(n.r.value, "query"), "x")),
              "a\r\nX-Injected: 1");
    json_decref(req);
    json_decref(o);
    netrec_clear(&n);
    /* the default user agent */
    get(e, q, echo, NULL, &n);
    CHECK_STR(json_string_value(
                  json_object_get(json_object_get(n.r.value, "headers"), "user-agent")),
              "fetchq/" FQ_VERSION_STRING);
    netrec_clear(&n);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* A URL with CR, LF, a space or another control character, and a NUL in
 * "user_agent" or "ca_file", are bad arguments like a CR/LF header value:
 * FQ_ERR_INVALID from the submit (or fq_engine_new), no callback. If the
 * submit accepts one, the test says so and also checks the weaker property
 * that nothing reaches the server and the callback fails with
 * FQ_ERR_INVALID. */
TEST(secure_control_chars_in_url_and_nul_in_options_refused_at_submit) {
    fqt_server s;
    fqt_server_start(&s, NULL);
    fq_engine *e = fqt_engine("{\"cache\": {\"max_bytes\": 0}}");
    fq_queue *q = fqt_queue(e, "q", 2);
    char echo[128];
    snprintf(echo, sizeof echo, "%s/echo", s.base);
    static const char *const tails[] = {"?x=a\r\nX-Injected: 1", "?x=a\nb", "?x=a\rb",
                                        "?x=a b", "?x=a\tb", "?x=a\x7f"};
    enum { NT = sizeof tails / sizeof tails[0] };
    enum { NCASES = NT + 2 };
    netrec n[NCASES];
    memset(n, 0, sizeof n);
    fq_op_id ids[NCASES];
    char what[NCASES][96];
    for (int i = 0; i < NCASES; i++) {
        json_t *req, *o = NULL;
        if (i < NT) {
            char url[256];
            snprintf(url, sizeof url, "%s%s", echo, tails[i]);
            req = json_pack("{s:s}", "url", url);
            snprintf(what[i], sizeof what[i], "URL with control character/space (case %d)", i);
        } else {
            req = json_pack("{s:s}", "url", echo);
            const char *key = i == NT ? "user_agent" : "ca_file";
            o = json_pack("{s:s#}", key, "a\0b", (size_t)3);
            snprintf(what[i], sizeof what[i], "option %s with a NUL", key);
        }
        ids[i] = fq_submit_request(q, req, o, net_done, &n[i]);
        if (ids[i] != FQ_ERR_INVALID)
            FAILF("%s: fq_submit_request returned %lld, expected FQ_ERR_INVALID", what[i],
                  (long long)ids[i]);
        json_decref(req);
        json_decref(o);
    }
    /* a search endpoint with a CR/LF outside {query} */
    {
        netrec sn;
        memset(&sn, 0, sizeof sn);
        char tmpl[256];
        snprintf(tmpl, sizeof tmpl, "%s?a=1\r\nX-Injected: 1&q={query}", echo);
        json_t *o = json_pack("{s:s}", "url", tmpl);
        fq_op_id id = fq_submit_search(q, "x", o, net_done, &sn);
        json_decref(o);
        if (id != FQ_ERR_INVALID) {
            FAILF("search url with CR/LF: fq_submit_search returned %lld, expected "
                  "FQ_ERR_INVALID",
                  (long long)id);
            if (id > 0) {
                CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
                CHECK_EQ_INT(atomic_load(&sn.r.calls), 1);
                CHECK_EQ_INT(sn.r.status, FQ_ERR_INVALID);
            }
        }
        netrec_clear(&sn);
    }
    /* config user_agent / ca_file with a NUL */
    static const char *const cfg_keys[] = {"user_agent", "ca_file"};
    for (int k = 0; k < 2; k++) {
        json_t *c = json_pack("{s:s#}", cfg_keys[k], "a\0b", (size_t)3);
        char errbuf[256] = "";
        fq_engine *bad = fq_engine_new(c, errbuf, sizeof errbuf);
        json_decref(c);
        if (bad) {
            FAILF("fq_engine_new with config %s containing a NUL succeeded", cfg_keys[k]);
            fqt_engine_free(bad);
        }
    }
    CHECK_OK(fq_engine_wait_idle(e, FQT_LONG_MS));
    for (int i = 0; i < NCASES; i++) {
        int calls = atomic_load(&n[i].r.calls);
        if (ids[i] <= 0) {
            CHECK_EQ_INT(calls, 0);
        } else if (calls != 1) {
            FAILF("%s: accepted, then %d callbacks", what[i], calls);
        } else if (n[i].r.outcome != FQ_FAILED || n[i].r.status != FQ_ERR_INVALID) {
            FAILF("%s: accepted, then outcome %d, %s (expected FQ_ERR_INVALID)", what[i],
                  n[i].r.outcome, sname(n[i].r.status));
        }
        netrec_clear(&n[i]);
    }
    CHECK_EQ_INT(fqt_server_stat(&s, "requests"), 0);
    CHECK_EQ_INT(fqt_server_stat(&s, "connections_total"), 0);
    fqt_engine_free(e);
    fqt_server_stop(&s);
}

/* ------------------------------------------------------------------ */
/* Credentials across redirects                                         */

/* GET from -> (redirect) with Authorization, Cookie and X-Custom; returns the
 * final /echo value's headers (NEW reference) and checks the first hop got
 * all three. */
static json_t *redirected_headers(fq_engine *e, fq_queue *q, const fqt_server *s,
                                  const char *from_base, const char *to, int status,
                                  const char *what) {
    char enc[256], url[512];
    fqt_pct(to, enc, sizeof enc);
    snprintf(url, sizeof url, "%s/redirect-to?url=%s&status=%d", from_base, enc, status);
    fqt_server_reset(s);
    json_t *req = json_pack("{s:s, s:{s:s, s:s, s:s}}", "url", url, "headers", "Authorization",
                            "Bearer secret", "Cookie", "a=b", "X-Custom", "kept");
    netrec n;
    run_request(e, q, req, NULL, &n);
    json_decref(req);
    expect(&n, FQ_SUCCEEDED, FQ_OK, 200, what);
    CHECK_EQ_INT(fqt_int(n.metrics, "redirects", -1), 1);
    json_t *h = json_incref(json_object_get(n.r.value, "headers"));
    if (!json_is_object(h)) FAILF("%s: the final response is not /echo's", what);
    netrec_clear(&n);
    /* the first hop (on this server or the other one) got everything */
    json_t *st = fqt_server_stats(s);
    json_t *log = json_object_get(st, "headers_log");
    json_t *first = NULL;
    size_t i;
    json_t *ent;
    json_array_foreach(log, i, ent) {
        const char *path = json_string_value(json_object_get(ent, "path"));
        if (path && strcmp(path, "/redirect-to") == 0)
            first = json_object_get(ent, "headers");
    }
    if (first) {
        CHECK_STR(json_string_value(json_object_get(first, "authorization")), "Bearer secret");
        CHECK_STR(json_string_value(json_object_get(first, "cookie")), "a=b");
    }
    json_decref(st);
    return h ? h : json_object();
}

TEST(secure_credentials_not_forwarded_to_another_host) {
    fqt_server s, other;
    fqt_server_start(&s, NULL);
    fqt_server_start(&other, NULL);
    fq_engine *e = fqt_engine("{\"cache\": {\"max_bytes\": 0}}");
    fq_queue *q = fqt_queue(e, "q", 1);
    char to[256], what[400];
    static const int statuses[] = {301, 302, 303, 307, 308};

    for (size_t k = 0; k < sizeof statuses / sizeof statuses[0]; k++) {
        int st = statuses[k];
        /* another host name, same server: 127.0.0.1 -> localhost */
        snprintf(to, sizeof to, "http://localhost:%d/echo", s.port);
        snprintf(what, sizeof what, "%d 127.0.0.1 -> %s", st, to);
        json_t *h = redirected_headers(e, q, &s, s.base, to, st, what);
        char host[64];
        snprintf(host, sizeof host, "localhost:%d", s.port);
        CHECK_STR(json_string_value(json_object_get(h, "host")), host);
        if (json_object_get(h, "authorization")) FAILF("%s: Authorization forwarded", what);
        if (json_object_get(h, "cookie")) FAILF("%s: Cookie forwarded", what);
        CHECK_STR(json_string_value(json_object_get(h, "x-custom")), "kept");
        json_decref(h);
        /* also as the server's headers_log shows it: the localhost entry */
        json_t *stats = fqt_server_stats(&s);
        json_t *log = json_object_get(stats, "headers_log");
        json_t *last = json_object_get(json_array_get(log, json_array_size(log) - 1), "headers");
        CHECK_STR(json_string_value(json_object_get(last, "host")), host);
        CHECK(json_object_get(last, "authorization") == NULL);
        CHECK(json_object_get(last, "cookie") == NULL);
        json_decref(stats);

        /* same host, another port (another origin) */
        snprintf(to, sizeof to, "http://127.0.0.1:%d/echo", other.port);
        snprintf(what, sizeof what, "%d %s -> %s", st, s.base, to);
        h = redirected_headers(e, q, &s, s.base, to, st, what);
        if (json_object_get(h, "authorization")) FAILF("%s: Authorization forwarded", what);
        if (json_object_get(h, "cookie")) FAILF("%s: Cookie forwarded", what);
        json_decref(h);

        /* same origin, relative and absolute: kept */
        snprintf(what, sizeof what, "%d same origin, relative /echo", st);
        h = redirected_headers(e, q, &s, s.base, "/echo", st, what);
        CHECK_STR(json_string_value(json_object_get(h, "authorization")), "Bearer secret");
        CHECK_STR(json_string_value(json_object_get(h, "cookie")), "a=b");
        json_decref(h);
        snprintf(to, sizeof to, "%s/echo", s.base);
        snprintf(what, sizeof what, "%d same origin, %s", st, to);
        h = redirected_headers(e, q, &s, s.base, to, st, what);
        CHECK_STR(json_string_value(json_object_get(h, "authorization")), "Bearer secret");
        CHECK_STR(json_string_value(json_object_get(h, "cookie")), "a=b");
        json_decref(h);
    }

    /* credentials in the URL (basic auth) are not sent to another host either */
    {
        char enc[256], url[512];
        snprintf(to, sizeof to, "http://localhost:%d/echo", s.port);
        fqt_pct(to, enc, sizeof enc);
        snprintf(url, sizeof url, "http://user:pw@127.0.0.1:%d/redirect-to?url=%s", s.port, enc);
        fqt_server_reset(&s);
        json_t *req = json_pack("{s:s}", "url", url);
        netrec n;
        run_request(e, q, req, NULL, &n);
        json_decref(req);
        expect(&n, FQ_SUCCEEDED, FQ_OK, 200, "user:pw@127.0.0.1 -> localhost");
        json_t *h = json_object_get(n.r.value, "headers");
        if (json_object_get(h, "authorization"))
            FAILF("URL credentials forwarded to another host: %s",
                  json_string_value(json_object_get(h, "authorization")));
        json_t *stats = fqt_server_stats(&s);
        json_t *first = json_object_get(
            json_array_get(json_object_get(stats, "headers_log"), 0), "headers");
        CHECK_STR(json_string_value(json_object_get(first, "authorization")),
                  "Basic dXNlcjpwdw=="); /* user:pw */
        json_decref(stats);
        netrec_clear(&n);
    }
    fqt_engine_free(e);
    CHECK(WAIT_UNTIL(fqt_server_stat(&s, "open_connections") == 0, 10000));
    CHECK(WAIT_UNTIL(fqt_server_stat(&other, "open_connections") == 0, 10000));
    fqt_server_stop(&other);
    fqt_server_stop(&s);
}
