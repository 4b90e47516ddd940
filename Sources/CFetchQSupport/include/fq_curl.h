/* Typed wrappers for libcurl's variadic calls, which Swift cannot call.
 * Internal to the engine; not part of the public ABI (fetchq.h).
 *
 * Each wrapper forwards to the variadic function with exactly the argument
 * type curl expects for that option family (long, pointer, string,
 * curl_off_t, function pointer), so the caller picks the type and the C
 * compiler does the promotion. Return values are curl's own. */
#ifndef FQ_CURL_H
#define FQ_CURL_H

#include <curl/curl.h>

#ifdef __cplusplus
extern "C" {
#endif

/* curl_easy_setopt, by argument type. */
CURLcode fqc_easy_setopt_long(CURL *easy, CURLoption option, long value);
CURLcode fqc_easy_setopt_off(CURL *easy, CURLoption option, curl_off_t value);
/* For string options curl copies the string (except CURLOPT_POSTFIELDS,
 * which must stay valid until the transfer is done). */
CURLcode fqc_easy_setopt_string(CURL *easy, CURLoption option, const char *value);
/* Any object pointer: CURLOPT_PRIVATE, CURLOPT_WRITEDATA, CURLOPT_HTTPHEADER,
 * CURLOPT_ERRORBUFFER, CURLOPT_POSTFIELDS, CURLOPT_XFERINFODATA, ... */
CURLcode fqc_easy_setopt_pointer(CURL *easy, CURLoption option, void *value);
/* CURLOPT_WRITEFUNCTION and CURLOPT_HEADERFUNCTION (same prototype). */
CURLcode fqc_easy_setopt_write_callback(CURL *easy, CURLoption option,
                                        curl_write_callback callback);
/* CURLOPT_XFERINFOFUNCTION. */
CURLcode fqc_easy_setopt_xferinfo_callback(CURL *easy, CURLoption option,
                                           curl_xferinfo_callback callback);

/* CURLOPT_PREREQFUNCTION (libcurl 7.80): called before each request is made
 * on a connection (the first, a redirect's, or curl's own re-send). */
CURLcode fqc_easy_setopt_prereq_callback(CURL *easy, curl_prereq_callback callback);

/* Whether the connection an easy handle is on multiplexes (HTTP/2 chosen by
 * ALPN), asked in a PREREQFUNCTION (after the handshake, before the
 * request): 1; 0 for HTTP/1.x (cleartext, or ALPN chose no h2); -1 when it
 * cannot tell (a TLS backend other than OpenSSL, libssl.so.3 not found). */
int fqc_connection_multiplexed(CURL *easy);

/* curl_easy_getinfo, by result type. `out` is written only on CURLE_OK. */
CURLcode fqc_easy_getinfo_long(CURL *easy, CURLINFO info, long *out);
CURLcode fqc_easy_getinfo_off(CURL *easy, CURLINFO info, curl_off_t *out);
CURLcode fqc_easy_getinfo_double(CURL *easy, CURLINFO info, double *out);
/* The string is owned by the handle; valid until the next setopt/reset/cleanup. */
CURLcode fqc_easy_getinfo_string(CURL *easy, CURLINFO info, const char **out);
/* CURLINFO_PRIVATE. */
CURLcode fqc_easy_getinfo_pointer(CURL *easy, CURLINFO info, void **out);

/* Makes every socket the easy handle opens close-on-exec (SOCK_CLOEXEC, set
 * atomically at socket()), so that a child the application spawns does not
 * inherit the engine's connections and keep them open. A socket() that
 * fails writes its errno to *socket_errno (curl keeps none of it: a process
 * out of descriptors reads "Couldn't connect to server"). */
CURLcode fqc_easy_cloexec_sockets(CURL *easy, int *socket_errno);

/* curl_multi_setopt, by argument type. */
CURLMcode fqc_multi_setopt_long(CURLM *multi, CURLMoption option, long value);
CURLMcode fqc_multi_setopt_pointer(CURLM *multi, CURLMoption option, void *value);

/* curl_multi_info_read, reduced to what the loop needs: returns 1 and fills
 * `easy` and `result` for the next CURLMSG_DONE message, 0 when the queue is
 * empty. Other message kinds (none exist today) are skipped. */
int fqc_multi_next_done(CURLM *multi, CURL **easy, CURLcode *result);

/* Names the calling thread (pthread_setname_np; at most 15 characters are
 * kept). Not a curl call, but the loop thread is the only user. */
void fqc_name_current_thread(const char *name);

#ifdef __cplusplus
}
#endif

#endif /* FQ_CURL_H */
