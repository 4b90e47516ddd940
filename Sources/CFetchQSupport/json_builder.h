/* What fqs_json_build adds to the walk over a JSON text (json_walk.c): the
 * jansson values, made as the walk checks each token. Private to
 * CFetchQSupport; every function here is called only by that walk, on
 * tokens it has already checked, so none of them checks the grammar again.
 *
 * The tree is made with the calls jansson's own parser makes, in the same
 * order: json_object / json_array for a container, put into its parent as
 * soon as it opens; json_object_setn_new_nocheck for each member, so a
 * repeated key replaces the earlier value in its place;
 * json_array_append_new; json_stringn_nocheck; json_integer; json_real; the
 * true/false/null singletons. So it is the tree json_loadb returns
 * (JSONBuilderTests compares the two). */
#ifndef FQ_JSON_BUILDER_H
#define FQ_JSON_BUILDER_H

#include <jansson.h> /* json_walk.c defines _GNU_SOURCE (strtod_l, newlocale) */
#include <locale.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "json_chars.h"

/* A buffer for decoded strings: on the stack while small, else on the heap
 * (kept for the rest of the walk). */
typedef struct {
    char *data;
    size_t cap;
    char *heap;
} fqs_scratch;

typedef struct {
    json_t *root;
    /* The open containers, innermost last. Each is already in its parent
     * (or is the root), which holds its only reference: a member added
     * later under the same key replaces it only after it was closed. */
    json_t **stack;
    size_t depth, cap;
    json_t *small_stack[32];
    /* The key of the member being read (in the input, or in key_buf). */
    const char *key;
    size_t key_len;
    fqs_scratch key_buf, value_buf;
    char key_space[128], value_space[256];
} fqs_builder;

static inline void builder_init(fqs_builder *b) {
    b->root = NULL;
    b->stack = b->small_stack;
    b->depth = 0;
    b->cap = sizeof b->small_stack / sizeof *b->small_stack;
    b->key = NULL;
    b->key_len = 0;
    b->key_buf = (fqs_scratch){b->key_space, sizeof b->key_space, NULL};
    b->value_buf = (fqs_scratch){b->value_space, sizeof b->value_space, NULL};
}

/* Frees the builder's own memory; the tree stays with the caller. */
static inline void builder_release(fqs_builder *b) {
    if (b->stack != b->small_stack) free(b->stack);
    free(b->key_buf.heap);
    free(b->value_buf.heap);
}

static char *scratch_reserve(fqs_scratch *s, size_t n) {
    if (n <= s->cap) return s->data;
    size_t cap = s->cap * 2 > n ? s->cap * 2 : n;
    char *grown = realloc(s->heap, cap);
    if (!grown) return NULL;
    s->heap = s->data = grown;
    s->cap = cap;
    return grown;
}

/* The bytes of the string body [p, end) (between the quotes, checked) with
 * its escapes decoded, into buf; NULL if the buffer could not grow. No
 * decoded form is longer than its escape (\uXXXX is 6 bytes for at most 3,
 * a surrogate pair 12 for 4), so the raw length is room enough. */
static char *decode_string(const unsigned char *p, const unsigned char *end, fqs_scratch *buf, size_t *len) {
    char *out = scratch_reserve(buf, (size_t)(end - p));
    if (!out) return NULL;
    char *o = out;
    while (p < end) {
        const unsigned char *q = memchr(p, '\\', (size_t)(end - p));
        if (!q) q = end;
        memcpy(o, p, (size_t)(q - p));
        o += q - p;
        p = q;
        if (p == end) break;
        p++; /* the backslash */
        unsigned char e = *p++;
        switch (e) {
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp = (unsigned)hex4(p, end); /* checked: four hex digits */
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* checked: \uDC00-\uDFFF follows */
                unsigned low = (unsigned)hex4(p + 2, end);
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
    }
    *len = (size_t)(o - out);
    return out;
}

/* Puts v into the innermost open container (under the current key, in an
 * object), or makes it the root. Steals v, also on failure (as the _new
 * calls do); NULL v (a failed allocation) fails. */
static inline int builder_put(fqs_builder *b, json_t *v) {
    if (!v) return 0;
    if (b->depth == 0) {
        b->root = v;
        return 1;
    }
    json_t *parent = b->stack[b->depth - 1];
    if (json_is_object(parent)) return json_object_setn_new_nocheck(parent, b->key, b->key_len, v) == 0;
    return json_array_append_new(parent, v) == 0;
}

/* A container opens: made, put in place, and made the innermost. */
static inline int builder_open(fqs_builder *b, int object) {
    json_t *v = object ? json_object() : json_array();
    if (!builder_put(b, v)) return 0;
    if (b->depth == b->cap) {
        size_t cap = b->cap * 2;
        json_t **grown = b->stack == b->small_stack ? malloc(cap * sizeof *grown) : realloc(b->stack, cap * sizeof *grown);
        if (!grown) return 0;
        if (b->stack == b->small_stack) memcpy(grown, b->small_stack, sizeof b->small_stack);
        b->stack = grown;
        b->cap = cap;
    }
    b->stack[b->depth++] = v;
    return 1;
}

static inline void builder_close(fqs_builder *b) { b->depth--; }

/* A member's key: the string body [p, end); `flags` from scan_string. */
static inline int builder_key(fqs_builder *b, const unsigned char *p, const unsigned char *end, int flags) {
    if (!(flags & FQS_STR_ESCAPED)) {
        b->key = (const char *)p;
        b->key_len = (size_t)(end - p);
        return 1;
    }
    b->key = decode_string(p, end, &b->key_buf, &b->key_len);
    return b->key != NULL;
}

/* A string value: the body [p, end); `flags` from scan_string. */
static inline int builder_string(fqs_builder *b, const unsigned char *p, const unsigned char *end, int flags) {
    if (!(flags & FQS_STR_ESCAPED)) return builder_put(b, json_stringn_nocheck((const char *)p, (size_t)(end - p)));
    size_t len;
    const char *text = decode_string(p, end, &b->value_buf, &len);
    return text && builder_put(b, json_stringn_nocheck(text, len));
}

/* Powers of ten a double holds exactly. */
static const double exact_pow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                     1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static locale_t c_numeric;
static pthread_once_t c_numeric_once = PTHREAD_ONCE_INIT;
static void make_c_numeric(void) { c_numeric = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0); }

/* strtod of the token [p, p + len) in the C locale (jansson's jsonp_strtod
 * swaps '.' for the locale's decimal point before calling strtod: the same
 * value). 0 when it cannot run (no locale object, no memory). */
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

/* A number token [start, end), checked: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?,
 * an integer within int64 (jansson reads it with strtoll), or a real that
 * does not overflow (strtod). Sets *is_int and *integer, or *real (the
 * correctly rounded double, as strtod gives it); 0 when strtod could not run.
 * Shared by both builders (json_builder.h, json_marshal.h). */
static int read_number(const unsigned char *start, const unsigned char *end, int *is_int, int64_t *integer,
                       double *real) {
    const unsigned char *p = start;
    int negative = *p == '-';
    if (negative) p++;
    uint64_t mantissa = 0; /* the digits of integer part and fraction, while <= 19 significant */
    int significant = 0;
    while (p < end && is_digit(*p)) {
        if (mantissa || *p != '0') significant++;
        if (significant <= 19) mantissa = mantissa * 10 + (uint64_t)(*p - '0');
        p++;
    }
    if (p == end) {
        /* An integer: at most 19 digits and within int64, so the magnitude is
         * exact in mantissa (up to 2^63 for the most negative value). */
        *is_int = 1;
        *integer = negative ? (int64_t)(0 - mantissa) : (int64_t)mantissa;
        return 1;
    }
    *is_int = 0;
    long long exponent = 0; /* of ten, applied to mantissa */
    if (*p == '.') {
        p++;
        while (p < end && is_digit(*p)) {
            if (mantissa || *p != '0') significant++;
            if (significant <= 19) mantissa = mantissa * 10 + (uint64_t)(*p - '0');
            exponent--;
            p++;
        }
    }
    if (p < end) { /* 'e' or 'E' */
        p++;
        int exp_negative = 0;
        if (*p == '+' || *p == '-') exp_negative = *p++ == '-';
        long long e = 0;
        while (p < end) {
            if (e < 1000000) e = e * 10 + (*p - '0'); /* beyond this only strtod decides */
            p++;
        }
        exponent += exp_negative ? -e : e;
    }
    if (significant <= 19 && mantissa < (UINT64_C(1) << 53) && exponent >= -22 && exponent <= 22) {
        /* Both operands exact, one correctly rounded operation: the correctly
         * rounded value, which is what strtod gives (Clinger's fast path). */
        double d = (double)mantissa;
        d = exponent < 0 ? d / exact_pow10[-exponent] : d * exact_pow10[exponent];
        *real = negative ? -d : d;
        return 1;
    }
    return slow_real(start, (size_t)(end - start), real);
}

static int builder_number(fqs_builder *b, const unsigned char *start, const unsigned char *end) {
    int is_int;
    int64_t integer;
    double real;
    if (!read_number(start, end, &is_int, &integer, &real)) return 0;
    return builder_put(b, is_int ? json_integer((json_int_t)integer) : json_real(real));
}

#endif
