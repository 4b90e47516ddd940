/* The one walk over a JSON text that answers both of these:
 *
 * fqs_json_valid: does JSONParser.parse accept these bytes? Answered in one
 * pass with no allocation and no value built.
 *
 * fqs_json_build: the value JSONParser.parse returns, made during the same
 * walk, without json_loadb. jansson's json_loadb spends most of its time in
 * its lexer (it reads one byte at a time through a stream with a UTF-8
 * check per byte, copies every token into a growing buffer and converts
 * every number with strtoll or strtod): about 204 k instructions for a 1 KB
 * search response, against about 46 k here (bench/findings.md, Fifteenth
 * round). What building adds to the walk is in json_builder.h; the walk is
 * inlined into each entry point, so checking alone pays nothing for it.
 *
 * JSONParser.parse is fqs_json_prescan (raw NUL, nesting past max_depth,
 * empty input) followed by jansson 2.14's json_loadb with JSON_DECODE_ANY |
 * JSON_ALLOW_NUL. The walk is a strict RFC 8259 recogniser plus the places
 * where jansson is stricter than the RFC; every such rule is marked
 * "jansson:" below and was checked against the installed libjansson (see
 * Tests/FetchQTests/JSONValidatorTests.swift and JSONBuilderTests.swift for
 * the differential tests: same verdict, and the same tree).
 *
 * Why the pre-scan needs no code of its own here: a raw NUL byte is never
 * valid in the grammar below (a control character inside a string, an
 * invalid token outside), empty or whitespace-only input has no value, and
 * on any input jansson accepts the pre-scan's bracket count (outside
 * strings) is exactly the nesting of arrays and objects, which is counted
 * below. On input jansson rejects the answer is 0 whatever the pre-scan
 * says. */
#define _GNU_SOURCE
#include "fq_json.h"
#include "json_builder.h"
#include "json_marshal.h"
#include "json_chars.h"

#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif


/* One UTF-8 sequence starting with the byte p[0] >= 0x80; returns the
 * position after it, or NULL.
 * jansson (stream_get, utf8_check_first/utf8_check_full) checks every byte
 * >= 0x80 it reads, inside strings or not: lead bytes C2-F4 only (80-BF are
 * stray continuations, C0/C1 always overlong, F5-FF past U+10FFFF), then
 * 1-3 continuation bytes 80-BF; no overlong forms (E0 needs A0-BF next, F0
 * needs 90-BF), no encoded surrogates U+D800-DFFF (ED needs 80-9F), nothing
 * above U+10FFFF (F4 needs 80-8F). A sequence cut short by the end of input
 * is an error (jansson reads EOF as a bad continuation byte). */
static const unsigned char *scan_utf8(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    size_t left = (size_t)(end - p);
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    size_t len;
    if (c < 0xC2) return NULL;
    if (c <= 0xDF) {
        len = 2;
    } else if (c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return NULL;
    }
    if (left < len) return NULL;
    if (p[1] < lo || p[1] > hi) return NULL;
    for (size_t i = 2; i < len; i++)
        if ((p[i] & 0xC0) != 0x80) return NULL;
    return p + len;
}

/* A string body: p is just after the opening quote. Returns the position
 * after the closing quote, or NULL.
 * jansson (lex_scan_string): raw bytes 00-1F are errors; escapes are
 * \" \\ \/ \b \f \n \r \t and \u with exactly four hex digits of any case.
 * Then, decoding: a \u high surrogate (D800-DBFF) must be immediately
 * followed by \u and a low surrogate (DC00-DFFF); a low surrogate on its own
 * is an error. \u0000 is accepted in values (JSON_ALLOW_NUL) but an object
 * key containing it is rejected (json_error_null_byte_in_key). Adds
 * FQS_STR_ESCAPED to *flags when the body has a backslash, FQS_STR_NONASCII
 * when it has a raw byte >= 0x80. */
static inline const unsigned char *scan_string(const unsigned char *p, const unsigned char *end, int is_key,
                                                 int *flags) {
    for (;;) { /* every round consumes at least one byte, or returns */
#if defined(__SSE2__)
        /* Skip 16 ordinary bytes at a time. As signed bytes, "< 0x20" catches
         * both control characters and every byte >= 0x80. */
        const __m128i quote = _mm_set1_epi8('"');
        const __m128i backslash = _mm_set1_epi8('\\');
        const __m128i space = _mm_set1_epi8(0x20);
        while (end - p >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
            __m128i special = _mm_or_si128(
                _mm_cmplt_epi8(v, space),
                _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)));
            int mask = _mm_movemask_epi8(special);
            if (mask) {
                p += __builtin_ctz((unsigned)mask);
                goto special;
            }
            p += 16;
        }
#endif
        while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') p++;
        if (p == end) return NULL; /* unterminated */
#if defined(__SSE2__)
    special:
#endif
        if (*p == '"') return p + 1;
        if (*p == '\\') {
            *flags |= FQS_STR_ESCAPED;
            p++;
            if (p == end) return NULL;
            switch (*p) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                p++;
                break;
            case 'u': {
                long cp = hex4(p + 1, end);
                if (cp < 0) return NULL;
                p += 5;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (end - p < 6 || p[0] != '\\' || p[1] != 'u') return NULL;
                    long low = hex4(p + 2, end);
                    if (low < 0xDC00 || low > 0xDFFF) return NULL;
                    p += 6;
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    return NULL;
                } else if (cp == 0 && is_key) {
                    return NULL;
                }
                break;
            }
            default:
                return NULL;
            }
        } else if (*p < 0x20) {
            return NULL; /* raw control character, NUL included */
        } else {
            *flags |= FQS_STR_NONASCII;
            p = scan_utf8(p, end);
            if (!p) return NULL;
        }
    }
}

/* 2^1024 - 2^970: halfway between DBL_MAX and 2^1024, 309 decimal digits.
 * strtod (glibc, correctly rounded, ties to even) overflows exactly for
 * magnitudes >= this: at the tie it rounds to the even neighbour 2^1024,
 * since DBL_MAX's significand is odd. */
static const char overflow_threshold[] =
    "17976931348623158079372897140530341507993413271003782693617377898044496829276475094664"
    "90179775872070963302864166928879109465555478519404026306574886715058206819089020007083"
    "83676273854845817711531764475730270069855571366959622842914819860834936475292719074168"
    "444365510704342711559699508093042880177904174497792";

/* Exponents saturate here while being read. Any input shorter than
 * ~10^17 bytes keeps the decisions below exact: a saturated exponent is
 * then far outside +-(length + 310) either way. */
#define EXP_SATURATION 100000000000000000LL

/* Whether a real token (one with a fraction or an exponent) makes strtod
 * overflow. The digits are int_part[0..int_len) then frac[0..frac_len)
 * (frac_len may be 0), times 10^exp.
 * jansson (jsonp_strtod): the token is rejected when strtod returns
 * +-HUGE_VAL with ERANGE; underflow (to a denormal or to 0) is accepted.
 * Let the value be 0.d1 d2 d3... x 10^order with d1 != 0, i.e. it lies in
 * [10^(order-1), 10^order). Since 10^308 < threshold < 10^309, order <= 308
 * never overflows, order >= 310 always does, and order == 309 compares the
 * significant digits with the threshold's. No strtod call, no buffer, exact
 * for any number of mantissa digits. */
static int real_overflows(const unsigned char *int_part, size_t int_len, const unsigned char *frac,
                          size_t frac_len, long long exp) {
    const unsigned char *seg1, *seg1_end, *seg2, *seg2_end;
    long long order;
    if (int_part[0] != '0') { /* no leading zeros: the first digit is significant */
        order = (long long)int_len + exp;
        if (order <= 308) return 0;
        seg1 = int_part;
        seg1_end = int_part + int_len;
        seg2 = frac;
        seg2_end = frac + frac_len;
    } else {
        if (exp <= 308) return 0; /* the value is below 10^exp */
        size_t zeros = 0;
        while (zeros < frac_len && frac[zeros] == '0') zeros++;
        if (zeros == frac_len) return 0; /* the value is zero */
        order = exp - (long long)zeros;
        if (order <= 308) return 0;
        seg1 = frac + zeros;
        seg1_end = frac + frac_len;
        seg2 = NULL;
        seg2_end = NULL;
    }
    if (order >= 310) return 1;
    /* order == 309: compare digit by digit, short mantissas padded with 0. */
    for (size_t k = 0; k < sizeof overflow_threshold - 1; k++) {
        unsigned char d = '0';
        if (seg1 < seg1_end) {
            d = *seg1++;
        } else if (seg2 < seg2_end) {
            d = *seg2++;
        }
        if (d != (unsigned char)overflow_threshold[k]) return d > (unsigned char)overflow_threshold[k];
    }
    return 1; /* equal to the threshold in its 309 digits: at or above it */
}

/* A number starting at p ('-' or a digit). Returns the position after it, or
 * NULL if it is malformed or jansson cannot represent it.
 * jansson (lex_scan_number): -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?;
 * "01", "-", "1.", ".5", "1e" are invalid tokens. A token with neither
 * fraction nor exponent is an integer read with strtoll: outside int64 it is
 * an error ("too big integer"), never converted to a real. Anything else is
 * a real read with strtod (see real_overflows). The byte after the token is
 * the next token's business. */
static const unsigned char *scan_number(const unsigned char *p, const unsigned char *end) {
    int negative = 0;
    if (*p == '-') {
        negative = 1;
        p++;
    }
    if (p == end || !is_digit(*p)) return NULL;
    const unsigned char *int_part = p;
    if (*p == '0') {
        p++;
        if (p < end && is_digit(*p)) return NULL; /* leading zero */
    } else {
        do p++;
        while (p < end && is_digit(*p));
    }
    size_t int_len = (size_t)(p - int_part);
    const unsigned char *frac = p;
    size_t frac_len = 0;
    int is_real = 0;
    long long exp = 0;
    if (p < end && *p == '.') {
        p++;
        frac = p;
        if (p == end || !is_digit(*p)) return NULL;
        do p++;
        while (p < end && is_digit(*p));
        frac_len = (size_t)(p - frac);
        is_real = 1;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        int exp_negative = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) {
            exp_negative = *p == '-';
            p++;
        }
        if (p == end || !is_digit(*p)) return NULL;
        do {
            if (exp < EXP_SATURATION) exp = exp * 10 + (*p - '0');
            p++;
        } while (p < end && is_digit(*p));
        if (exp_negative) exp = -exp;
        is_real = 1;
    }
    if (!is_real) {
        /* Without leading zeros, 18 digits always fit in int64, 20 never. */
        if (int_len < 19) return p;
        if (int_len > 19) return NULL;
        const char *max = negative ? "9223372036854775808" : "9223372036854775807";
        return memcmp(int_part, max, 19) <= 0 ? p : NULL;
    }
    return real_overflows(int_part, int_len, frac, frac_len, exp) ? NULL : p;
}

/* Whether the literal `word` (of length len) is at p. jansson reads a whole
 * run of letters and compares it, so "truex" is one bad token; here "true"
 * matches and the following "x" fails as a bad token instead: same verdict. */
static inline int literal_at(const unsigned char *p, const unsigned char *end, const char *word, size_t len) {
    return (size_t)(end - p) >= len && memcmp(p, word, len) == 0;
}

/* The walk: 1 when JSONParser.parse accepts the bytes. With a builder it
 * also makes the value (b->root, also the part made so far when it fails;
 * it fails too when an allocation fails). With a marshal encoder it also
 * writes the value in marshal's format (m->out; what the encoder cannot
 * write sets m->failed and does not end the walk). At most one of b and m
 * is given; each is a constant in each caller, where this is inlined. */
static inline __attribute__((always_inline)) int walk(const unsigned char *bytes, size_t len, long max_depth,
                                                      fqs_builder *b, fqs_marshal *m) {
    if (bytes == NULL || len == 0) return 0; /* the pre-scan: no value at all */
    const unsigned char *p = bytes;
    const unsigned char *end = bytes + len;

    /* Depth. The engine (pre-scan, with JSONParser's max(0, maxDepth)) fails
     * on a `[` or `{` that opens level max_depth + 1. jansson (parse_value)
     * counts every value, scalars too: the top-level value has depth 1, a
     * value inside k containers depth k + 1, and depth > JSON_PARSER_MAX_DEPTH
     * fails. So at most 2048 nested containers ("[" x 2048 then "]" x 2048
     * parses), and inside 2048 of them not even a scalar ("[[...[1]...]]" with
     * 2048 brackets fails). Both rules together: a container may open only
     * when fewer than min(max_depth, 2048) are open, and a scalar only when
     * fewer than 2048 are. */
    size_t limit = max_depth < 0 ? 0 : (size_t)max_depth;
    if (limit > FQS_JANSSON_MAX_DEPTH) limit = FQS_JANSSON_MAX_DEPTH;
    unsigned char in_object[FQS_JANSSON_MAX_DEPTH / 8]; /* bit per open container */
    size_t depth = 0;

    /* Each step below consumes at least one byte or returns, so the walk
     * ends after at most len steps. */
value:
    p = skip_ws(p, end);
    if (p == end) return 0;
    if (depth >= FQS_JANSSON_MAX_DEPTH) return 0; /* jansson's depth 2049 */
    switch (*p) {
    case '{':
    case '[': {
        int object = *p == '{';
        if (depth >= limit) return 0;
        unsigned char bit = (unsigned char)(1u << (depth % 8));
        in_object[depth / 8] = (unsigned char)(object ? in_object[depth / 8] | bit : in_object[depth / 8] & ~bit);
        depth++;
        if (b && !builder_open(b, object)) return 0;
        if (m) marshal_open(m, object);
        p = skip_ws(p + 1, end);
        if (p == end) return 0;
        if (*p == (object ? '}' : ']')) {
            p++;
            depth--;
            if (b) builder_close(b);
            if (m) marshal_close(m);
            goto after_value;
        }
        if (object) goto key;
        goto value;
    }
    case '"': {
        const unsigned char *start = p + 1;
        int flags = 0;
        p = scan_string(start, end, 0, &flags);
        if (!p) return 0;
        if (b && !builder_string(b, start, p - 1, flags)) return 0;
        if (m) marshal_string(m, start, p - 1, flags);
        goto after_value;
    }
    case 't':
    case 'f':
    case 'n': {
        static const char *const words[] = {"true", "false", "null"};
        int which = *p == 't' ? 0 : *p == 'f' ? 1 : 2;
        size_t n = which == 1 ? 5 : 4;
        if (!literal_at(p, end, words[which], n)) return 0;
        p += n;
        if (b && !builder_put(b, which == 0 ? json_true() : which == 1 ? json_false() : json_null())) return 0;
        if (m) marshal_byte(m, which == 0 ? 'T' : which == 1 ? 'F' : 'N');
        goto after_value;
    }
    case '-': case '0': case '1': case '2': case '3': case '4':
    case '5': case '6': case '7': case '8': case '9':
    {
        const unsigned char *start = p;
        p = scan_number(p, end);
        if (!p) return 0;
        if (b && !builder_number(b, start, p)) return 0;
        if (m) marshal_number(m, start, p);
        goto after_value;
    }
    default:
        return 0;
    }

key: /* p is at a non-whitespace byte where an object key must start */
    if (*p != '"') return 0;
    {
        const unsigned char *start = p + 1;
        int flags = 0;
        p = scan_string(start, end, 1, &flags);
        if (!p) return 0;
        if (b && !builder_key(b, start, p - 1, flags)) return 0;
        if (m) marshal_key(m, start, p - 1, flags);
    }
    p = skip_ws(p, end);
    if (p == end || *p != ':') return 0;
    p++;
    goto value;

after_value:
    p = skip_ws(p, end);
    if (depth == 0) return p == end; /* jansson: only whitespace after the value */
    if (p == end) return 0;
    if (in_object[(depth - 1) / 8] & (1u << ((depth - 1) % 8))) {
        if (*p == ',') {
            p = skip_ws(p + 1, end);
            if (p == end) return 0;
            goto key;
        }
        if (*p != '}') return 0;
    } else {
        if (*p == ',') {
            p++;
            goto value;
        }
        if (*p != ']') return 0;
    }
    p++;
    depth--;
    if (b) builder_close(b);
    if (m) marshal_close(m);
    goto after_value;
}

int fqs_json_valid(const unsigned char *bytes, size_t len, long max_depth) {
    return walk(bytes, len, max_depth, NULL, NULL);
}

void *fqs_json_build(const unsigned char *bytes, size_t len, long max_depth) {
    fqs_builder b;
    builder_init(&b);
    int ok = walk(bytes, len, max_depth, &b, NULL);
    builder_release(&b);
    if (ok) return b.root;
    json_decref(b.root); /* NULL-safe: frees the part made so far */
    return NULL;
}

int fqs_json_marshal(const unsigned char *bytes, size_t len, long max_depth, unsigned char **out, size_t *out_len) {
    fqs_marshal m;
    marshal_init(&m, bytes, len);
    int ok = walk(bytes, len, max_depth, NULL, &m);
    if (!ok) m.failed = 1;
    *out = marshal_finish(&m, out_len);
    return ok;
}
