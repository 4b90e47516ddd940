/* Byte helpers shared by the JSON walk (json_walk.c) and builder
 * (json_builder.h). Private to CFetchQSupport. */
#ifndef FQ_JSON_CHARS_H
#define FQ_JSON_CHARS_H

/* jansson: whitespace is space, tab, LF and CR only (no FF, VT, BOM). */
static inline int is_ws(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* What scan_string (json_walk.c) tells the builders about a string body. */
enum {
    FQS_STR_ESCAPED = 1,  /* it has a backslash escape */
    FQS_STR_NONASCII = 2, /* it has a raw byte >= 0x80 (valid UTF-8) */
};

static inline int is_digit(unsigned char c) { return (unsigned)(c - '0') < 10u; }

static inline const unsigned char *skip_ws(const unsigned char *p, const unsigned char *end) {
    while (p < end && is_ws(*p)) p++;
    return p;
}

/* The value of four hex digits (any case) at p, or -1. */
static inline long hex4(const unsigned char *p, const unsigned char *end) {
    if (end - p < 4) return -1;
    long v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p[i];
        int d;
        if (is_digit(c)) {
            d = c - '0';
        } else {
            c |= 0x20; /* 'A'-'F' -> 'a'-'f'; no other byte lands in 'a'-'f' */
            if (c < 'a' || c > 'f') return -1;
            d = c - 'a' + 10;
        }
        v = v * 16 + d;
    }
    return v;
}

#endif
