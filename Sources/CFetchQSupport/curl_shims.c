/* Typed front ends for libcurl's variadic functions; see fq_curl.h. */
#define _GNU_SOURCE /* pthread_setname_np */
#include "fq_curl.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sys/socket.h>
#include <string.h>

CURLcode fqc_easy_setopt_long(CURL *easy, CURLoption option, long value) {
    return curl_easy_setopt(easy, option, value);
}

CURLcode fqc_easy_setopt_off(CURL *easy, CURLoption option, curl_off_t value) {
    return curl_easy_setopt(easy, option, value);
}

CURLcode fqc_easy_setopt_string(CURL *easy, CURLoption option, const char *value) {
    return curl_easy_setopt(easy, option, value);
}

CURLcode fqc_easy_setopt_pointer(CURL *easy, CURLoption option, void *value) {
    return curl_easy_setopt(easy, option, value);
}

CURLcode fqc_easy_setopt_write_callback(CURL *easy, CURLoption option,
                                        curl_write_callback callback) {
    return curl_easy_setopt(easy, option, callback);
}

CURLcode fqc_easy_setopt_xferinfo_callback(CURL *easy, CURLoption option,
                                           curl_xferinfo_callback callback) {
    return curl_easy_setopt(easy, option, callback);
}

CURLcode fqc_easy_setopt_prereq_callback(CURL *easy, curl_prereq_callback callback) {
    return curl_easy_setopt(easy, CURLOPT_PREREQFUNCTION, callback);
}

/* OpenSSL's SSL_get0_alpn_selected, from the libssl libcurl loaded (looked up
 * at run time: fetchq does not link libssl itself). */
typedef void (*alpn_selected_fn)(const void *ssl, const unsigned char **data, unsigned int *len);
static alpn_selected_fn alpn_selected;
static pthread_once_t alpn_once = PTHREAD_ONCE_INIT;

static void find_alpn_selected(void) {
    void *libssl = dlopen("libssl.so.3", RTLD_LAZY | RTLD_NOLOAD);
    if (libssl) alpn_selected = (alpn_selected_fn)dlsym(libssl, "SSL_get0_alpn_selected");
}

int fqc_connection_multiplexed(CURL *easy) {
    struct curl_tlssessioninfo *tls = NULL;
    if (curl_easy_getinfo(easy, CURLINFO_TLS_SSL_PTR, &tls) != CURLE_OK || tls == NULL) return -1;
    if (tls->internals == NULL) return 0; /* cleartext: HTTP/1.1 (fetchq never asks for h2c) */
    if (tls->backend != CURLSSLBACKEND_OPENSSL) return -1;
    pthread_once(&alpn_once, find_alpn_selected);
    if (alpn_selected == NULL) return -1;
    const unsigned char *protocol = NULL;
    unsigned int length = 0;
    alpn_selected(tls->internals, &protocol, &length);
    return length == 2 && protocol[0] == 'h' && protocol[1] == '2';
}

CURLcode fqc_easy_getinfo_long(CURL *easy, CURLINFO info, long *out) {
    return curl_easy_getinfo(easy, info, out);
}

CURLcode fqc_easy_getinfo_off(CURL *easy, CURLINFO info, curl_off_t *out) {
    return curl_easy_getinfo(easy, info, out);
}

CURLcode fqc_easy_getinfo_double(CURL *easy, CURLINFO info, double *out) {
    return curl_easy_getinfo(easy, info, out);
}

CURLcode fqc_easy_getinfo_string(CURL *easy, CURLINFO info, const char **out) {
    /* curl's prototype for string infos is `char **`. */
    char *value = NULL;
    CURLcode rc = curl_easy_getinfo(easy, info, &value);
    if (rc == CURLE_OK)
        *out = value;
    return rc;
}

CURLcode fqc_easy_getinfo_pointer(CURL *easy, CURLINFO info, void **out) {
    /* CURLINFO_PRIVATE is documented as `char **`. */
    char *value = NULL;
    CURLcode rc = curl_easy_getinfo(easy, info, &value);
    if (rc == CURLE_OK)
        *out = value;
    return rc;
}

static curl_socket_t open_cloexec(void *clientp, curlsocktype purpose, struct curl_sockaddr *address) {
    (void)purpose;
    curl_socket_t s = socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
    if (s == CURL_SOCKET_BAD && clientp != NULL) *(int *)clientp = errno;
    return s;
}

CURLcode fqc_easy_cloexec_sockets(CURL *easy, int *socket_errno) {
    CURLcode rc = curl_easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, open_cloexec);
    return rc != CURLE_OK ? rc : curl_easy_setopt(easy, CURLOPT_OPENSOCKETDATA, (void *)socket_errno);
}

CURLMcode fqc_multi_setopt_long(CURLM *multi, CURLMoption option, long value) {
    return curl_multi_setopt(multi, option, value);
}

CURLMcode fqc_multi_setopt_pointer(CURLM *multi, CURLMoption option, void *value) {
    return curl_multi_setopt(multi, option, value);
}

int fqc_multi_next_done(CURLM *multi, CURL **easy, CURLcode *result) {
    int queued = 0;
    CURLMsg *msg;
    while ((msg = curl_multi_info_read(multi, &queued)) != NULL) {
        if (msg->msg == CURLMSG_DONE) {
            *easy = msg->easy_handle;
            *result = msg->data.result;
            return 1;
        }
    }
    return 0;
}

void fqc_name_current_thread(const char *name) {
    char short_name[16];
    strncpy(short_name, name, sizeof short_name - 1);
    short_name[sizeof short_name - 1] = '\0';
    (void)pthread_setname_np(pthread_self(), short_name);
}
