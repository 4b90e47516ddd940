/* fqs_json_build: the value JSONParser.parse returns, built without
 * json_loadb.
 *
 * jansson's json_loadb spends most of its time in its lexer: it reads the
 * input one byte at a time through a stream with a UTF-8 check per byte,
 * copies every token into a growing buffer, and converts every number with
 * strtoll or strtod (about 230 k instructions for a 1 KB search response,
 * bench/findings.md, Fifteenth round). Here the input is first checked by
 * fqs_json_valid (json_validate.c: exactly what JSONParser.parse accepts,
 * tested against jansson), so the walk below can trust it and only builds:
 * strings without escapes are copied straight from the input, integers are
 * read by hand, and reals go through strtod only when the one-step exact
 * conversion below does not apply.
 *
 * The tree is made with the calls jansson's own parser makes, in the same
 * order (json_object_setn_new_nocheck for each member, so a repeated key
 * replaces the earlier value in its place; json_array_append_new;
 * json_stringn_nocheck; json_integer; json_real; the true/false/null
 * singletons), so it is the tree json_loadb returns: JSONBuilderTests
 * compares the two on the conformance suite, hand-written cases and a
 * mutation fuzz. On anything unexpected (the input is not valid, an
 * allocation fails) the result is NULL and the caller parses with jansson,
 * which then gives the value or its own error. */
#define _GNU_SOURCE
#include "fq_json.h"
#include "json_chars.h"

#include <jansson.h>
#include <locale.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif


/* The next '"' or '\\' at or after p (the input is valid, so there is one
 * before end). */
static inline const unsigned char *next_special(const unsigned char *p, const unsigned char *end) {
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"');
    const __m128i backslash = _mm_set1_epi8('\\');
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        int mask = _mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)));
        if (mask) return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#endif
    while (p < end && *p != '"' && *p != '\\') p++;
    return p;
}

static inline unsigned hex4(const unsigned char *p) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i];
        v = v * 16 + (is_digit((unsigned char)c) ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
}

/* A buffer for decoded strings: on the stack while small, else on the heap
 * (kept for the rest of the walk). */
typedef struct {
    char *data;
    size_t cap;
    char *heap;
} scratch;

static char *scratch_reserve(scratch *s, size_t n) {
    if (n <= s->cap) return s->data;
    size_t cap = s->cap * 2 > n ? s->cap * 2 : n;
    char *grown = realloc(s->heap, cap);
    if (!grown) return NULL;
    s->heap = s->data = grown;
    s->cap = cap;
    return grown;
}

/* A string whose body starts at p (after the opening quote): sets *text and
 * *len to its decoded bytes (in the input itself when it has no escape,
 * else in `buf`) and returns the position after the closing quote; NULL if
 * the buffer could not grow. */
static const unsigned char *read_string(const unsigned char *p, const unsigned char *end, scratch *buf,
                                        const char **text, size_t *len) {
    const unsigned char *q = next_special(p, end);
    if (*q == '"') {
        *text = (const char *)p;
        *len = (size_t)(q - p);
        return q + 1;
    }
    /* Escapes: find the closing quote first (the byte after a backslash is
     * never it), then decode into a buffer of the raw length, which no
     * decoded form exceeds (\uXXXX is 6 bytes for at most 3, a surrogate
     * pair 12 for 4). */
    const unsigned char *close = q;
    while (*close != '"') {
        close = next_special(close + 2, end); /* past the backslash and the byte it escapes */
    }
    char *out = scratch_reserve(buf, (size_t)(close - p));
    if (!out) return NULL;
    char *o = out;
    for (;;) {
        memcpy(o, p, (size_t)(q - p));
        o += q - p;
        p = q;
        if (*p == '"') break;
        p++; /* the backslash */
        unsigned char e = *p++;
        switch (e) {
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp = hex4(p);
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* a valid input pairs it with \uDC00-\uDFFF */
                unsigned low = hex4(p + 2);
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            }
            if (cp < 0x80) {
                *o++ = (char)cp;
            } else if (cp < 0x800) {
                *o++ = (char)(0xC0 | (cp >> 6));
                *o++ = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                *o++ = (char)(0xE0 | (cp >> 12));
                *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *o++ = (char)(0x80 | (cp & 0x3F));
            } else {
                *o++ = (char)(0xF0 | (cp >> 18));
                *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
                *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *o++ = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: /* '"', '\\', '/' stand for themselves */
            *o++ = (char)e;
            break;
        }
        q = next_special(p, end);
    }
    *text = out;
    *len = (size_t)(o - out);
    return close + 1;
}

/* Powers of ten a double holds exactly. */
static const double exact_pow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                     1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static locale_t c_numeric;
static pthread_once_t c_numeric_once = PTHREAD_ONCE_INIT;
static void make_c_numeric(void) { c_numeric = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0); }

/* strtod of the token [p, end) in the C locale (jansson's jsonp_strtod swaps
 * '.' for the locale's decimal point before calling strtod: the same value).
 * Returns 0 when it cannot run (no locale object, no memory). */
static int slow_real(const unsigned char *p, size_t len, double *out) {
    pthread_once(&c_numeric_once, make_c_numeric);
    if (c_numeric == (locale_t)0) return 0;
    char small[64];
    char *copy = len < sizeof small ? small : malloc(len + 1);
    if (!copy) return 0;
    memcpy(copy, p, len);
    copy[len] = 0;
    *out = strtod_l(copy, NULL, c_numeric);
    if (copy != small) free(copy);
    return 1;
}

/* A number token at p (valid: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?,
 * an integer within int64, a real that does not overflow). Returns the
 * position after it and sets *value, or returns NULL (no memory). */
static const unsigned char *read_number(const unsigned char *p, const unsigned char *end, json_t **value) {
    const unsigned char *start = p;
    int negative = *p == '-';
    if (negative) p++;
    uint64_t mantissa = 0; /* the digits of integer part and fraction, while <= 19 significant */
    int significant = 0;
    while (p < end && is_digit(*p)) {
        if (mantissa || *p != '0') significant++;
        if (significant <= 19) mantissa = mantissa * 10 + (uint64_t)(*p - '0');
        p++;
    }
    int is_real = 0;
    long long exponent = 0; /* of ten, applied to mantissa */
    if (p < end && *p == '.') {
        is_real = 1;
        p++;
        while (p < end && is_digit(*p)) {
            if (mantissa || *p != '0') significant++;
            if (significant <= 19) mantissa = mantissa * 10 + (uint64_t)(*p - '0');
            exponent--;
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_real = 1;
        p++;
        int exp_negative = 0;
        if (*p == '+' || *p == '-') exp_negative = *p++ == '-';
        long long e = 0;
        while (p < end && is_digit(*p)) {
            if (e < 1000000) e = e * 10 + (*p - '0'); /* beyond this only strtod decides */
            p++;
        }
        exponent += exp_negative ? -e : e;
    }
    if (!is_real) {
        /* Valid, so at most 19 digits and within int64: the magnitude is
         * exact in mantissa (up to 2^63 for the most negative value). */
        json_int_t v = negative ? (json_int_t)(0 - mantissa) : (json_int_t)mantissa;
        *value = json_integer(v);
        return *value ? p : NULL;
    }
    double d;
    if (significant <= 19 && mantissa < (UINT64_C(1) << 53) && exponent >= -22 && exponent <= 22) {
        /* Both operands exact, one correctly rounded operation: the correctly
         * rounded value, which is what strtod gives (Clinger's fast path). */
        d = (double)mantissa;
        d = exponent < 0 ? d / exact_pow10[-exponent] : d * exact_pow10[exponent];
        if (negative) d = -d;
    } else if (!slow_real(start, (size_t)(p - start), &d)) {
        return NULL;
    }
    *value = json_real(d);
    return *value ? p : NULL;
}

/* Puts v into the innermost open container (under key, in an object), or
 * makes it the root. Steals v, also on failure (as the _new calls do). */
static int attach(json_t **stack, size_t depth, json_t **root, const char *key, size_t key_len, json_t *v) {
    if (depth == 0) {
        *root = v;
        return 1;
    }
    json_t *parent = stack[depth - 1];
    if (json_is_object(parent)) return json_object_setn_new_nocheck(parent, key, key_len, v) == 0;
    return json_array_append_new(parent, v) == 0;
}

void *fqs_json_build(const unsigned char *bytes, size_t len, long max_depth) {
    if (!fqs_json_valid(bytes, len, max_depth)) return NULL;
    const unsigned char *p = bytes;
    const unsigned char *end = bytes + len;
    json_t *root = NULL;
    /* The open containers, innermost last. Each is already in its parent
     * (or is the root), which holds its only reference: a member added
     * later under the same key replaces it only after it was closed. */
    json_t *small_stack[32];
    json_t **stack = small_stack;
    size_t stack_cap = sizeof small_stack / sizeof *small_stack;
    size_t depth = 0;
    char key_space[128], value_space[256];
    scratch key_buf = {key_space, sizeof key_space, NULL};
    scratch value_buf = {value_space, sizeof value_space, NULL};
    const char *key = NULL;
    size_t key_len = 0;
    json_t *v;

value:
    p = skip_ws(p, end);
    switch (*p) {
    case '{':
    case '[':
        v = *p == '{' ? json_object() : json_array();
        p++;
        if (!v || !attach(stack, depth, &root, key, key_len, v)) goto fail;
        if (depth == stack_cap) {
            size_t cap = stack_cap * 2;
            json_t **grown = stack == small_stack ? malloc(cap * sizeof *grown) : realloc(stack, cap * sizeof *grown);
            if (!grown) goto fail;
            if (stack == small_stack) memcpy(grown, small_stack, sizeof small_stack);
            stack = grown;
            stack_cap = cap;
        }
        stack[depth++] = v;
        p = skip_ws(p, end);
        if (*p == '}' || *p == ']') {
            p++;
            depth--;
            goto after_value;
        }
        if (json_is_object(v)) goto key;
        goto value;
    case '"': {
        const char *text;
        size_t text_len;
        p = read_string(p + 1, end, &value_buf, &text, &text_len);
        if (!p) goto fail;
        v = json_stringn_nocheck(text, text_len);
        break;
    }
    case 't':
        v = json_true();
        p += 4;
        break;
    case 'f':
        v = json_false();
        p += 5;
        break;
    case 'n':
        v = json_null();
        p += 4;
        break;
    default:
        p = read_number(p, end, &v);
        if (!p) goto fail;
        break;
    }
    if (!v || !attach(stack, depth, &root, key, key_len, v)) goto fail;

after_value:
    p = skip_ws(p, end);
    if (depth == 0) goto done; /* valid: only whitespace was left */
    if (*p == ',') {
        p = skip_ws(p + 1, end);
        if (json_is_object(stack[depth - 1])) goto key;
        goto value;
    }
    p++; /* '}' or ']' */
    depth--;
    goto after_value;

key: /* p is at the key's opening quote */
    p = read_string(p + 1, end, &key_buf, &key, &key_len);
    if (!p) goto fail;
    p = skip_ws(p, end) + 1; /* past ':' */
    goto value;

fail:
    json_decref(root); /* NULL-safe; frees every value attached so far */
    root = NULL;
done:
    if (stack != small_stack) free(stack);
    free(key_buf.heap);
    free(value_buf.heap);
    return root;
}
