/* JSONParser's pre-scan in C: the Swift loop cost ~20 instructions per byte
 * (58 k per 3 KB response, 5 % of fq_bench p2); this one costs 3-5. */
#include "fq_json.h"

int fqs_json_prescan(const unsigned char *p, size_t n, long max_depth, long *where) {
    long depth = 0;
    int saw_value = 0;
    size_t i = 0;
    while (i < n) {
        switch (p[i]) {
        case 0:
            *where = (long)i;
            return FQS_SCAN_NUL;
        case '"':
            saw_value = 1;
            i++;
            /* Inside a string: only the closing quote, a backslash (which
             * escapes the next byte) and NUL matter. */
            for (;;) {
                if (i >= n) goto end; /* unterminated: jansson reports it */
                unsigned char c = p[i];
                if (c == '"') break;
                if (c == 0) {
                    *where = (long)i;
                    return FQS_SCAN_NUL;
                }
                if (c == '\\') {
                    i++;
                    if (i >= n) goto end;
                    if (p[i] == 0) {
                        *where = (long)i;
                        return FQS_SCAN_NUL;
                    }
                }
                i++;
            }
            break;
        case '[':
        case '{':
            saw_value = 1;
            if (++depth > max_depth) {
                *where = (long)i;
                return FQS_SCAN_DEPTH;
            }
            break;
        case ']':
        case '}':
            depth--; /* may go negative on invalid input; jansson reports that */
            saw_value = 1;
            break;
        case ' ':
        case '\t':
        case '\n':
        case '\r':
            break;
        default:
            saw_value = 1;
        }
        i++;
    }
end:
    if (!saw_value) {
        *where = (long)n - 1;
        return FQS_SCAN_EMPTY;
    }
    return FQS_SCAN_OK;
}
