#!/usr/bin/env bash
# make test-examples: build every examples/*.c against build/lib/libfetchq.so
# and run the examples against one test search server (Tests/support/
# testserver.py, corpus "test"). Prints one line per example (ok / FAILED,
# with the example's output when it failed) and ends with exactly
# "N passed, N failed"; exits 1 if any failed, 2 if it could not start.
# Needs `make lib` first (the Makefile's test-examples target does it).
#
#   bash tools/run-examples.sh
#
# Environment: CC (default cc), PYTHON (python3), VERBOSE=1 prints every
# example's output, MEMCHECK=1 runs the C examples under valgrind (definite
# leaks and memory errors fail them), EXAMPLE_TIMEOUT seconds per run (120).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build
PYTHON=${PYTHON:-python3}
CC=${CC:-cc}
TIMEOUT=${EXAMPLE_TIMEOUT:-120}
# Tags of the test corpus (Tests/support/corpus.py TEST_TAGS).
TAGS=(swift c python rust go)

die() { printf 'run-examples: %s\n' "$*" >&2; exit 2; }

# shellcheck source=tools/common.sh
. "$ROOT/tools/common.sh"
check_prerequisites
make_workdir examples  # removed on exit with the temporary stores

MEMCHECK_CMD=()
if [ "${MEMCHECK:-0}" = 1 ]; then
    command -v valgrind >/dev/null || die "MEMCHECK=1 needs valgrind"
    command -v objcopy >/dev/null || die "MEMCHECK=1 needs objcopy (binutils)"
    # Valgrind cannot read the DWARF 5 the Swift toolchain emits ("unhandled
    # dwarf2 abbrev form code 0x25" ... "Giving up"): run the examples on a
    # copy without debug info (symbols stay), found first via
    # LD_LIBRARY_PATH (the examples' rpath is a RUNPATH, which it overrides).
    mkdir -p "$WORK/memcheck-lib"
    objcopy --strip-debug "$BUILD/lib/libfetchq.so" "$WORK/memcheck-lib/libfetchq.so.0" ||
        die "objcopy --strip-debug build/lib/libfetchq.so failed"
    # Only definite leaks fail a run: the Swift runtime's metadata caches
    # show up as "possibly lost"/"still reachable" and are not ours.
    MEMCHECK_CMD=(env LD_LIBRARY_PATH="$WORK/memcheck-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
                  valgrind -q --leak-check=full --show-leak-kinds=definite
                  --errors-for-leak-kinds=definite --error-exitcode=99)
    TIMEOUT=$((TIMEOUT * 5))
fi

start_test_server test 1800
echo "test server: $URL (pid $server_pid, corpus test)"

PKG=$(PKG_CONFIG_PATH="$BUILD/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}" \
    pkg-config --cflags --libs fetchq) || die "pkg-config --cflags --libs fetchq failed"
mkdir -p "$BUILD/examples"

passed=0
failed=0
# report NAME STATUS LOG: one line per example; the log when it failed.
report() {
    local name=$1 status=$2 log=$3
    if [ "$status" = 0 ]; then
        passed=$((passed + 1))
        printf '%-24s ok\n' "$name"
        [ "${VERBOSE:-0}" = 1 ] && sed 's/^/    | /' "$log"
    else
        failed=$((failed + 1))
        printf '%-24s FAILED (exit %s)\n' "$name" "$status"
        sed 's/^/    | /' "$log"
    fi
    return 0
}

# run NAME LOG CMD...: runs a built example with a time limit.
run() {
    local name=$1 log=$2 status=0
    shift 2
    (cd "$ROOT" && timeout "$TIMEOUT" "$@") >"$log" 2>&1 || status=$?
    [ "$status" = 124 ] && echo "(killed after ${TIMEOUT} s)" >>"$log"
    report "$name" "$status" "$log"
}

for src in "$ROOT"/examples/*.c; do
    [ -e "$src" ] || continue
    name=$(basename "$src" .c)
    exe=$BUILD/examples/$name
    log=$WORK/$name.log
    # $PKG is a list of flags: split on purpose.
    # shellcheck disable=SC2206
    cmd=("$CC" -std=c11 -O2 -g -Wall -Wextra -Werror "$src" $PKG -lpthread
         -Wl,-rpath,"$BUILD/lib" -o "$exe")
    if ! "${cmd[@]}" >"$log" 2>&1; then
        { echo "compile failed:"; echo "${cmd[*]}"; } >>"$log"
        report "$name.c" 1 "$log"
        continue
    fi
    case $name in
    search_tags)
        run "$name.c" "$log" "${MEMCHECK_CMD[@]}" "$exe" -n 5 "$URL" "${TAGS[@]}" ;;
    pipeline | store)
        run "$name.c" "$log" "${MEMCHECK_CMD[@]}" "$exe" "$URL" "$WORK/$name.db" ;;
    *)
        # No recipe to run it yet: building it warning-free is the test.
        echo "built $exe (not run: no recipe in tools/run-examples.sh)" >"$log"
        report "$name.c (build only)" 0 "$log" ;;
    esac
done

if [ -d "$ROOT/bindings/python/fetchq" ] && [ -e "$ROOT/examples/search.py" ]; then
    run search.py "$WORK/search.py.log" env FETCHQ_LIBRARY="$BUILD/lib/libfetchq.so.0" \
        PYTHONPATH="$ROOT/bindings/python${PYTHONPATH:+:$PYTHONPATH}" \
        "$PYTHON" "$ROOT/examples/search.py" "$URL"
fi

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
