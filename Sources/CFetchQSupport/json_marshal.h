/* What fqs_json_marshal adds to the walk over a JSON text (json_walk.c):
 * the value written in CPython's marshal format, so that a Python binding
 * makes the objects with marshal.loads() instead of scanning the text again
 * with json.loads() on its own thread (bench/findings.md, "Nineteenth
 * round"). Private to CFetchQSupport; every function here is called only by
 * that walk, on tokens it has already checked.
 *
 * marshal.loads() of the output equals json.loads() of the input, for every
 * input the walk accepts (jansson's rules: integers within int64, finite
 * reals, strict UTF-8, no lone surrogates): the same types, the same float
 * bits, the same key order (a repeated key keeps its first place and takes
 * the last value in both, since marshal's reader sets the members in order).
 * Like json.loads, a key repeated in the document is one str object: its
 * first appearance is flagged as a reference and the later ones refer to it.
 *
 * The codes used, as CPython's Python/marshal.c reads them (all of them read
 * the same way since Python 3.4, marshal version 3):
 *   '0' end of a dict            'N' None   'F' False   'T' True
 *   'i' int32, little-endian     'l' int: int32 n (negative for a negative
 *                                     number), |n| 15-bit digits as uint16,
 *                                     least significant first, the last nonzero
 *   'g' double, IEEE little-endian
 *   'z' ASCII str, uint8 length  'a' ASCII str, int32 length
 *   'u' str, int32 length, UTF-8
 *   '[' list, int32 count, items '{' dict: key, value, ..., then '0'
 *   'r' int32: the index-th object flagged with 0x80 on its code
 *
 * What cannot be written this way makes no output (fqs_json_marshal then
 * hands back NULL and the walk still decides validity): nesting deeper than
 * FQS_MARSHAL_MAX_DEPTH, a string or list longer than INT32_MAX, a failed
 * allocation. */
#ifndef FQ_JSON_MARSHAL_H
#define FQ_JSON_MARSHAL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "json_builder.h"
#include "json_chars.h"

/* Deeper documents get no output: the binding then parses the body with
 * json.loads, which under Python's default recursion limit (1000) fails
 * somewhere below 1000 levels, depending on how deep its caller's stack is
 * (marshal's own reader allows 2000). Up to this depth the marshal form
 * gives the value even where a caller deep in its stack would have made
 * json.loads fail. */
#define FQS_MARSHAL_MAX_DEPTH 500

/* Keys remembered for references (the first ones of a document; later
 * distinct keys are written in full each time). */
#define FQS_MARSHAL_KEYS 96
#define FQS_MARSHAL_KEY_SLOTS 128 /* a power of two above FQS_MARSHAL_KEYS */

typedef struct {
    size_t offset;  /* a list's count field in the output (0 for a dict) */
    uint32_t count; /* a list's items so far */
} fqs_marshal_open;

typedef struct {
    const unsigned char *text; /* in the input (keys without escapes only) */
    uint64_t head; /* its first 8 bytes (fewer: zero-padded; see key_head) */
    uint32_t len;
    uint32_t ref; /* its index among the flagged objects; 0 in an empty slot */
} fqs_marshal_key;

typedef struct {
    unsigned char *out;
    size_t len, cap;
    const unsigned char *input_end; /* the end of the text being walked */
    int failed; /* nothing more is written; the output is dropped */
    fqs_marshal_open *stack;
    size_t depth, stack_cap;
    fqs_marshal_open small_stack[16];
    uint32_t refs; /* objects flagged so far (the next one's index) */
    uint32_t keys; /* keys remembered */
    fqs_marshal_key key_slots[FQS_MARSHAL_KEY_SLOTS]; /* ref is index + 1 */
    fqs_scratch buf; /* decoded strings with escapes */
    char space[256];
} fqs_marshal;

static inline void marshal_init(fqs_marshal *m, const unsigned char *input, size_t input_len) {
    m->input_end = input + input_len;
    m->cap = input_len + input_len / 4 + 64;
    m->out = malloc(m->cap);
    m->len = 0;
    m->failed = m->out == NULL;
    m->stack = m->small_stack;
    m->depth = 0;
    m->stack_cap = sizeof m->small_stack / sizeof *m->small_stack;
    m->refs = m->keys = 0;
    memset(m->key_slots, 0, sizeof m->key_slots);
    m->buf = (fqs_scratch){m->space, sizeof m->space, NULL};
}

/* Frees the encoder's own memory; the output stays with the caller (NULL
 * after a failure). */
static inline unsigned char *marshal_finish(fqs_marshal *m, size_t *len) {
    if (m->stack != m->small_stack) free(m->stack);
    free(m->buf.heap);
    if (m->failed) {
        free(m->out);
        *len = 0;
        return NULL;
    }
    *len = m->len;
    return m->out;
}

/* Room for n more bytes at m->out + m->len; NULL (and the encoder failed)
 * when it cannot grow. */
static inline unsigned char *marshal_room(fqs_marshal *m, size_t n) {
    if (m->failed) return NULL;
    if (m->cap - m->len < n) {
        size_t cap = m->cap * 2 > m->len + n ? m->cap * 2 : m->len + n;
        unsigned char *grown = realloc(m->out, cap);
        if (!grown) {
            m->failed = 1;
            return NULL;
        }
        m->out = grown;
        m->cap = cap;
    }
    return m->out + m->len;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define FQS_LITTLE_ENDIAN 1
#else
#define FQS_LITTLE_ENDIAN 0
#endif

static inline void put_le32(unsigned char *o, uint32_t v) {
#if FQS_LITTLE_ENDIAN
    memcpy(o, &v, 4);
#else
    o[0] = (unsigned char)v;
    o[1] = (unsigned char)(v >> 8);
    o[2] = (unsigned char)(v >> 16);
    o[3] = (unsigned char)(v >> 24);
#endif
}

static inline void put_le64(unsigned char *o, uint64_t v) {
#if FQS_LITTLE_ENDIAN
    memcpy(o, &v, 8);
#else
    for (int i = 0; i < 8; i++) o[i] = (unsigned char)(v >> (8 * i));
#endif
}

/* The first min(len, 8) bytes of a key as one word, the rest zero (byte i
 * at bits 8i..8i+7, on any host): two keys of the same length up to 8 bytes
 * are equal exactly when their heads are. Reads 8 bytes at once when the
 * text has them (past a short key that is its closing quote and what
 * follows, all inside the text), else byte by byte. */
static inline uint64_t key_head(const unsigned char *p, size_t len, const unsigned char *input_end) {
    uint64_t w = 0;
    if (FQS_LITTLE_ENDIAN && input_end - p >= 8) {
        memcpy(&w, p, 8);
        if (len < 8) w &= (UINT64_C(1) << (8 * len)) - 1;
        return w;
    }
    size_t n = len < 8 ? len : 8;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
    return w;
}

/* A value goes into the innermost container: a list counts it. */
static inline void marshal_item(fqs_marshal *m) {
    if (m->depth == 0) return;
    fqs_marshal_open *top = &m->stack[m->depth - 1];
    if (top->offset == 0) return; /* a dict */
    if (top->count == INT32_MAX) {
        m->failed = 1;
        return;
    }
    top->count++;
}

static inline void marshal_byte(fqs_marshal *m, unsigned char code) {
    marshal_item(m);
    unsigned char *o = marshal_room(m, 1);
    if (!o) return;
    *o = code;
    m->len++;
}

static inline void marshal_open(fqs_marshal *m, int object) {
    if (m->failed) return;
    if (m->depth >= FQS_MARSHAL_MAX_DEPTH) {
        m->failed = 1;
        return;
    }
    marshal_item(m);
    unsigned char *o = marshal_room(m, 5);
    if (!o) return;
    if (m->depth == m->stack_cap) {
        size_t cap = m->stack_cap * 2;
        fqs_marshal_open *grown = m->stack == m->small_stack ? malloc(cap * sizeof *grown)
                                                              : realloc(m->stack, cap * sizeof *grown);
        if (!grown) {
            m->failed = 1;
            return;
        }
        if (m->stack == m->small_stack) memcpy(grown, m->small_stack, sizeof m->small_stack);
        m->stack = grown;
        m->stack_cap = cap;
    }
    /* A list's count field follows its code (so its offset is never 0). */
    o[0] = object ? '{' : '[';
    m->stack[m->depth++] = (fqs_marshal_open){object ? 0 : m->len + 1, 0};
    m->len += object ? 1 : 5;
}

static inline void marshal_close(fqs_marshal *m) {
    if (m->failed) return;
    fqs_marshal_open top = m->stack[--m->depth];
    if (top.offset) {
        put_le32(m->out + top.offset, top.count);
        return;
    }
    unsigned char *o = marshal_room(m, 1);
    if (!o) return;
    *o = '0';
    m->len++;
}

/* The str `text` of `len` bytes (valid UTF-8; `ascii` when every byte is
 * below 0x80), with `flag` (0 or 0x80) on its code. */
static inline void marshal_str(fqs_marshal *m, const unsigned char *text, size_t len, int ascii, unsigned char flag) {
    if (len > INT32_MAX) {
        m->failed = 1;
        return;
    }
    unsigned char *o = marshal_room(m, len + 5);
    if (!o) return;
    size_t head;
    if (ascii && len <= 255) {
        o[0] = 'z' | flag;
        o[1] = (unsigned char)len;
        head = 2;
    } else {
        o[0] = (ascii ? 'a' : 'u') | flag;
        put_le32(o + 1, (uint32_t)len);
        head = 5;
    }
    memcpy(o + head, text, len);
    m->len += head + len;
}

static inline int all_ascii(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

/* A string body [p, end) with escapes, decoded and written (not flagged). */
static inline void marshal_decoded(fqs_marshal *m, const unsigned char *p, const unsigned char *end) {
    size_t len;
    const char *text = decode_string(p, end, &m->buf, &len);
    if (!text) {
        m->failed = 1;
        return;
    }
    marshal_str(m, (const unsigned char *)text, len, all_ascii(text, len), 0);
}

/* A string value: the body [p, end); `flags` from scan_string. */
static inline void marshal_string(fqs_marshal *m, const unsigned char *p, const unsigned char *end, int flags) {
    marshal_item(m);
    if (m->failed) return;
    if (flags & FQS_STR_ESCAPED) {
        marshal_decoded(m, p, end);
        return;
    }
    marshal_str(m, p, (size_t)(end - p), !(flags & FQS_STR_NONASCII), 0);
}

/* A member's key: the body [p, end); `flags` from scan_string. A key without
 * escapes is looked up among the remembered ones: found, it is written as a
 * reference; else, while there is room, remembered and flagged. The table is
 * hashed on the key's first and last 8 bytes and its length; a key is found
 * by its length and head, and for keys longer than 8 bytes by the rest of
 * its bytes too. */
static inline void marshal_key(fqs_marshal *m, const unsigned char *p, const unsigned char *end, int flags) {
    if (m->failed) return;
    size_t len = (size_t)(end - p);
    if (flags & FQS_STR_ESCAPED) {
        marshal_decoded(m, p, end);
        return;
    }
    if (len > INT32_MAX) {
        m->failed = 1;
        return;
    }
    uint64_t head = key_head(p, len, m->input_end);
    uint64_t tail = len > 8 ? key_head(end - 8, 8, m->input_end) : 0;
    uint64_t h = (head ^ (tail * UINT64_C(0xC2B2AE3D27D4EB4F)) ^ len) * UINT64_C(0x9E3779B97F4A7C15);
    for (uint32_t i = (uint32_t)(h >> 32);; i++) {
        fqs_marshal_key *slot = &m->key_slots[i & (FQS_MARSHAL_KEY_SLOTS - 1)];
        if (slot->ref == 0) {
            if (m->keys == FQS_MARSHAL_KEYS || m->refs == INT32_MAX) break; /* written in full */
            *slot = (fqs_marshal_key){p, head, (uint32_t)len, m->refs + 1};
            m->keys++;
            m->refs++;
            marshal_str(m, p, len, !(flags & FQS_STR_NONASCII), 0x80);
            return;
        }
        if (slot->len == len && slot->head == head && (len <= 8 || memcmp(slot->text + 8, p + 8, len - 8) == 0)) {
            unsigned char *o = marshal_room(m, 5);
            if (!o) return;
            o[0] = 'r';
            put_le32(o + 1, slot->ref - 1);
            m->len += 5;
            return;
        }
    }
    marshal_str(m, p, len, !(flags & FQS_STR_NONASCII), 0);
}

/* A number token [start, end), checked (see read_number). */
static inline void marshal_number(fqs_marshal *m, const unsigned char *start, const unsigned char *end) {
    marshal_item(m);
    if (m->failed) return;
    int is_int;
    int64_t integer;
    double real;
    if (!read_number(start, end, &is_int, &integer, &real)) {
        m->failed = 1;
        return;
    }
    unsigned char *o = marshal_room(m, 1 + 4 + 5 * 2);
    if (!o) return;
    if (!is_int) {
        uint64_t bits;
        memcpy(&bits, &real, sizeof bits);
        o[0] = 'g';
        put_le64(o + 1, bits);
        m->len += 9;
    } else if (integer >= INT32_MIN && integer <= INT32_MAX) {
        o[0] = 'i';
        put_le32(o + 1, (uint32_t)(int32_t)integer);
        m->len += 5;
    } else {
        /* 2^31 <= |integer| <= 2^63: three to five 15-bit digits. */
        uint64_t magnitude = integer < 0 ? 0 - (uint64_t)integer : (uint64_t)integer;
        int32_t digits = 0;
        o[0] = 'l';
        while (magnitude) {
            unsigned digit = (unsigned)(magnitude & 0x7FFF);
            o[5 + 2 * digits] = (unsigned char)digit;
            o[6 + 2 * digits] = (unsigned char)(digit >> 8);
            digits++;
            magnitude >>= 15;
        }
        put_le32(o + 1, (uint32_t)(integer < 0 ? -digits : digits));
        m->len += 5 + 2 * (size_t)digits;
    }
}

#endif
