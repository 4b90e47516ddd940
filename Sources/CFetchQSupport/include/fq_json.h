/* JSON helpers for the Swift engine; not part of the public ABI (the export
 * map hides them). */
#ifndef FQ_JSON_H
#define FQ_JSON_H

#include <stddef.h>

enum {
    FQS_SCAN_OK = 0,
    FQS_SCAN_NUL = 1,   /* a NUL byte at *where */
    FQS_SCAN_DEPTH = 2, /* the bracket at *where opens level max_depth + 1 */
    FQS_SCAN_EMPTY = 3, /* no value at all; *where = len - 1 */
};

/* JSONParser's pre-scan, one pass over `len` bytes: finds the first raw NUL
 * byte (inside or outside strings), the first `[` or `{` nested deeper than
 * max_depth (brackets inside strings do not count; a backslash escapes the
 * next byte), or input holding only JSON whitespace. Returns one of the
 * FQS_SCAN_ codes; *where is the byte index of the problem (or len - 1 for
 * FQS_SCAN_EMPTY, so -1 for empty input). Everything else (bad tokens,
 * unbalanced or unterminated input) is left to jansson. */
int fqs_json_prescan(const unsigned char *bytes, size_t len, long max_depth, long *where);

/* jansson's JSON_PARSER_MAX_DEPTH in the installed build (jansson_config.h);
 * the tests check that the two agree. */
#define FQS_JANSSON_MAX_DEPTH 2048

/* 1 when JSONParser.parse(bytes, maxDepth: max_depth) would succeed, else 0.
 * One pass, no allocation, no value built: the pre-scan's rules (raw NUL,
 * nesting past max_depth, negative max_depth treated as 0, empty input) and
 * jansson 2.14's json_loadb with JSON_DECODE_ANY | JSON_ALLOW_NUL (strict
 * UTF-8, \u surrogate pairing, no \u0000 in object keys, integers within
 * int64, reals that do not overflow a double, its own nesting limit). See
 * json_walk.c for each rule. */
int fqs_json_valid(const unsigned char *bytes, size_t len, long max_depth);

/* The value JSONParser.parse(bytes, maxDepth: max_depth) gives, as a new
 * json_t reference (a `json_t *`; void here so that this header needs no
 * jansson), built without json_loadb; NULL when the input is not valid
 * (fqs_json_valid) or an allocation failed: then jansson must parse it,
 * for the value or for its error. Built during the same one walk that
 * fqs_json_valid does: json_walk.c, json_builder.h. */
void *fqs_json_build(const unsigned char *bytes, size_t len, long max_depth);

/* fqs_json_valid(bytes, len, max_depth), and when it is 1, the value also
 * written in CPython's marshal format: *out gets a malloc'd buffer (free()
 * it) of *out_len bytes that marshal.loads() reads to what json.loads()
 * reads from the same bytes, or NULL (and *out_len 0) when the input is not
 * valid or the value cannot be written that way (nested deeper than 500
 * levels, a string or list longer than INT32_MAX, no memory). One walk:
 * json_walk.c, json_marshal.h. */
int fqs_json_marshal(const unsigned char *bytes, size_t len, long max_depth, unsigned char **out, size_t *out_len);

#endif
