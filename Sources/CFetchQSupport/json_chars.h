/* Byte classes shared by the JSON walk (json_walk.c) and builder
 * (json_builder.h). Private to CFetchQSupport. */
#ifndef FQ_JSON_CHARS_H
#define FQ_JSON_CHARS_H

/* jansson: whitespace is space, tab, LF and CR only (no FF, VT, BOM). */
static inline int is_ws(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static inline int is_digit(unsigned char c) { return (unsigned)(c - '0') < 10u; }

static inline const unsigned char *skip_ws(const unsigned char *p, const unsigned char *end) {
    while (p < end && is_ws(*p)) p++;
    return p;
}

#endif
