#!/usr/bin/env bash
# check_exports.sh LIB HEADER
#
# The library must export exactly the functions declared in the header: no
# missing function (a declared but unimplemented call fails at link time in the
# user's program) and no extra global symbol (a leaked internal becomes ABI).
# Prints the differences and ends with "1 passed, 0 failed" or "0 passed, 1
# failed"; exits non-zero on any mismatch.
set -u -o pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 LIB HEADER" >&2
    exit 2
fi
lib=$1
header=$2
for f in "$lib" "$header"; do
    if [ ! -r "$f" ]; then
        echo "check_exports: cannot read $f" >&2
        echo "0 passed, 1 failed"
        exit 1
    fi
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Function names declared in the header. Comments are removed first (the
# comments mention functions as "fq_x()"), then every "fq_name(" that is not
# the "(*fq_name_fn)(" of a function-pointer typedef is a declaration.
strip_comments() {
    # The preprocessor with -fpreprocessed removes comments without expanding
    # macros or reading includes; fall back to a small awk if cc is missing.
    if command -v "${CC:-cc}" >/dev/null 2>&1 &&
        "${CC:-cc}" -fpreprocessed -dD -E -P -x c "$1" 2>/dev/null; then
        return 0
    fi
    awk '
        BEGIN { incomment = 0 }
        {
            line = $0; out = ""
            while (length(line) > 0) {
                if (incomment) {
                    i = index(line, "*/")
                    if (i == 0) { line = ""; break }
                    line = substr(line, i + 2); incomment = 0
                } else {
                    i = index(line, "/*"); j = index(line, "//")
                    if (j > 0 && (i == 0 || j < i)) { out = out substr(line, 1, j - 1); line = ""; break }
                    if (i == 0) { out = out line; line = ""; break }
                    out = out substr(line, 1, i - 1); line = substr(line, i + 2); incomment = 1
                }
            }
            print out
        }' "$1"
}

strip_comments "$header" |
    grep -v '^[[:space:]]*#' |
    sed -E 's/\([[:space:]]*\*[[:space:]]*fq_[_[:alnum:]]+[[:space:]]*\)//g' |
    grep -oE '(^|[^_[:alnum:]])fq_[_[:alnum:]]+[[:space:]]*\(' |
    sed -E 's/^[^f]*//; s/[[:space:]]*\($//' |
    sort -u >"$tmp/header"

if [ ! -s "$tmp/header" ]; then
    echo "check_exports: found no fq_ function declarations in $header" >&2
    echo "0 passed, 1 failed"
    exit 1
fi

# Global defined symbols of the library (nm -D: upper-case type = global).
# T/W/i are functions; anything else global (data, ...) besides the version
# node (type A) is reported as an extra export. "@VERSION" suffixes dropped.
if ! nm -D --defined-only "$lib" >"$tmp/nm" 2>"$tmp/nm.err"; then
    echo "check_exports: nm failed on $lib:" >&2
    cat "$tmp/nm.err" >&2
    echo "0 passed, 1 failed"
    exit 1
fi
awk 'NF >= 3 && $2 ~ /^[TWi]$/ { sub(/@.*/, "", $3); print $3 }' "$tmp/nm" | sort -u >"$tmp/lib"
awk 'NF >= 3 && $2 ~ /^[BCDGRSUV]$/ { sub(/@.*/, "", $3); print $2, $3 }' "$tmp/nm" |
    sort -u >"$tmp/libdata"
# Symbols the toolchain always defines in a shared object.
grep -vxE '_init|_fini' "$tmp/lib" >"$tmp/lib.f" || true

missing=$(comm -23 "$tmp/header" "$tmp/lib.f")
extra=$(comm -13 "$tmp/header" "$tmp/lib.f")
status=0
nheader=$(wc -l <"$tmp/header")
nlib=$(wc -l <"$tmp/lib.f")
echo "check_exports: $nheader functions in $(basename "$header"), $nlib exported functions in $(basename "$lib")"
if [ -n "$missing" ]; then
    echo "declared in the header but not exported:"
    printf '  %s\n' $missing
    status=1
fi
if [ -n "$extra" ]; then
    n=$(printf '%s\n' "$extra" | wc -l)
    echo "exported but not declared in the header ($n):"
    printf '%s\n' "$extra" | head -50 | sed 's/^/  /'
    [ "$n" -gt 50 ] && echo "  ... and $((n - 50)) more"
    status=1
fi
if [ -s "$tmp/libdata" ]; then
    n=$(wc -l <"$tmp/libdata")
    echo "global non-function symbols exported ($n):"
    head -50 "$tmp/libdata" | sed 's/^/  /'
    status=1
fi

if [ $status -eq 0 ]; then
    echo "1 passed, 0 failed"
else
    echo "0 passed, 1 failed"
fi
exit $status
