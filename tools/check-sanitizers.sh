#!/usr/bin/env bash
# make check-sanitizers: the test suites under ThreadSanitizer, AddressSanitizer
# (+ LeakSanitizer) and valgrind (docs/reliability.md, "Sanitizers").
#
#   bash tools/check-sanitizers.sh [STEP...]      (default: every step)
#
# Steps:
#   swift-tsan   swift test --sanitize=thread   (scratch .build-tsan)
#   swift-asan   swift test --sanitize=address  (scratch .build-asan; leaks too)
#   c-asan       libfetchq.so built with -sanitize=address (scratch
#                .build-asan-lib) and the C harness (Tests/c) built with the
#                toolchain's clang -fsanitize=address, run in one process (-n)
#                so that LeakSanitizer checks at exit (a forked test ends with
#                _exit, which skips the check)
#   c-valgrind   the C harness against build/lib/libfetchq.so under valgrind
#                memcheck; each test in its own child (the harness forks), so
#                a memory error or definite leak fails that test by name
#
# The ASan and valgrind steps run with FETCHQ_JANSSON_CACHE=0: fetchq's cache
# of freed jansson blocks would keep a block that is used after its free, or
# freed twice on another thread, from reaching the tool's allocator, which
# reports both. The cache's own tests install it for themselves (Swift
# JanssonCacheTests, C jansson_cache_*); swift-tsan runs with it as shipped.
#
# Needs `make lib` (build/lib, build/include) for the C steps. Logs go to
# build/sanitizers/logs/STEP.log; prints one line per step with its duration
# and a digest of any report; exits 1 if a step failed, 2 if it could not run.
#
# Environment:
#   VALGRIND_SKIP   tests not run under valgrind (default: the two stress tests
#                   that take minutes there, which still run in c-asan, and
#                   the test that lowers RLIMIT_AS, which valgrind's own
#                   address space would not fit; and the test of 8 processes
#                   opening one new file together, whose 2 s of patience
#                   valgrind's slowness uses up; and the test asking
#                   jansson's allocator for SIZE_MAX bytes, which valgrind
#                   reports as a fishy malloc). Set it empty to run
#                   everything.
#   ASAN_SKIP       tests not run in c-asan (default: the test that lowers
#                   RLIMIT_AS, under which ASan's shadow memory cannot exist;
#                   the test asking for SIZE_MAX bytes, at which ASan stops).
#   FQ_TEST_TIMEOUT_SCALE  timeout multiplier for the C harness under valgrind
#                   (default 20) and ASan (default 3)
#   SWIFT, CLANG, VALGRIND  tools (defaults: swift, clang, valgrind)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD=$ROOT/build
OUT=$BUILD/sanitizers
LOGS=$OUT/logs
SWIFT=${SWIFT:-swift}
CLANG=${CLANG:-clang}
VALGRIND=${VALGRIND:-valgrind}
VALGRIND_SKIP=${VALGRIND_SKIP-race_block_return_vs_cancel_exactly_once stress_100k_mixed_ops misuse_engine_new_when_no_thread_can_start faults_processes_opening_one_new_file_together_all_start jansson_cache_refuses_sizes_no_block_can_have}
ASAN_SKIP=${ASAN_SKIP-misuse_engine_new_when_no_thread_can_start jansson_cache_refuses_sizes_no_block_can_have}
VERSION=$(sed -n 's/^#define FQ_VERSION_MAJOR \([0-9]*\)/\1/p' include/fetchq.h)
SONAME=libfetchq.so.$VERSION
# As the Makefile's test-c and lib targets.
CFLAGS_TEST=(-std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE -I"$BUILD/include")
RELEASE_FLAGS=(-c release -Xswiftc -static-stdlib -Xlinker --version-script="$ROOT/tools/fetchq.map"
    -Xlinker -soname="$SONAME")
# Swift's crash backtracer runs inside the crashing process and trips ASan.
export SWIFT_BACKTRACE=enable=no

ALL_STEPS=(swift-tsan swift-asan c-asan c-valgrind)
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=("${ALL_STEPS[@]}")
for s in "${steps[@]}"; do
    case " ${ALL_STEPS[*]} " in *" $s "*) ;; *) echo "check-sanitizers: unknown step $s (${ALL_STEPS[*]})" >&2; exit 2 ;; esac
done
mkdir -p "$LOGS"

# Leaks that are not ours: the XCTest runner that `swift test` also starts.
cat >"$OUT/lsan.supp" <<'EOF'
leak:libXCTest.so
EOF

now() { date +%s; }

# A short digest of a log: sanitizer summaries, and for leaks the first frames
# in our sources, counted.
digest() {
    python3 - "$1" "$ROOT" <<'EOF'
import collections, re, sys
root = sys.argv[2] + "/"
text = open(sys.argv[1], errors="replace").read().replace(root, "")
summaries = collections.Counter(re.findall(r"^SUMMARY: .*$", text, re.M))
for line, n in summaries.most_common(8):
    print(f"    {n}x {line[:200]}")
frames = collections.Counter()
# LeakSanitizer: the first frame in our sources; valgrind (no debug info in the
# library): the first frame after the allocator.
for block in re.split(r"\n(?=(?:Direct|Indirect) leak of)", text)[1:]:
    ours = re.findall(r" in (\S+) (\S*(?:Sources|Tests)/\S+)$", block.split("\n\n")[0], re.M)
    if ours:
        frames[f"{ours[0][0][:90]} {ours[0][1].split('/')[-1]}"] += 1
for block in re.findall(r"bytes in [\d,]+ blocks are definitely lost.*\n((?:==\d+==    .*\n)+)", text):
    calls = re.findall(r"by 0x[0-9A-F]+: (\S+)", block)
    if calls:
        frames[" <- ".join(calls[:2])[:140]] += 1
for frame, n in frames.most_common(8):
    print(f"    leak from: {n}x {frame}")
errors = collections.Counter(re.findall(r"^==\d+== ((?:Invalid|Conditional|Syscall|Mismatched|Use of|Source and).*)$", text, re.M))
for line, n in errors.most_common(8):
    print(f"    {n}x {line[:200]}")
EOF
}

failed=()
report() {  # step, seconds, ok(0/1), note
    local mark="ok"
    [ "$3" -ne 0 ] && { mark="FAILED"; failed+=("$1"); }
    printf '%-11s %-6s %4d s  %s\n' "$1" "$mark" "$2" "$4"
    [ "$3" -ne 0 ] && { digest "$LOGS/$1.log"; echo "    log: ${LOGS#"$ROOT"/}/$1.log"; }
    return 0
}

# `swift test` under a sanitizer: fails on a non-zero exit or any report.
swift_test() {  # step, sanitizer, scratch
    local log=$LOGS/$1.log t0 rc
    t0=$(now)
    rc=0
    (
        # A failed build fails the step: the tests must not run from an
        # earlier build's binaries.
        "$SWIFT" build --build-tests --sanitize="$2" --scratch-path "$3" 2>&1 | grep -v "Cannot export local symbol"
        if [ "${PIPESTATUS[0]}" -ne 0 ]; then
            echo "== the build failed"
            exit 3
        fi
        echo "== built in $(( $(now) - t0 )) s"
        # SWIFT_TEST_FILTER runs a reduced set (make test's TSan step).
        "$SWIFT" test --skip-build --sanitize="$2" --scratch-path "$3" \
            ${SWIFT_TEST_FILTER:+--filter "$SWIFT_TEST_FILTER"} 2>&1
    ) >"$log"
    rc=$?
    grep -qE "^(WARNING: ThreadSanitizer|==[0-9]+==ERROR: (Address|Leak)Sanitizer)" "$log" && rc=1
    grep -qE "Test run with .* failed" "$log" && rc=1
    local tests built
    tests=$(grep -oE "Test run with [0-9]+ tests.*(passed|failed)" "$log" | tail -1)
    built=$(sed -n 's/^== built in \([0-9]*\) s/\1/p' "$log")
    report "$1" $(( $(now) - t0 )) "$rc" "${tests:-no test summary} (build ${built:-?} s)"
}

need_lib() {
    if [ ! -e "$BUILD/lib/libfetchq.so" ] || [ ! -e "$BUILD/include/fetchq.h" ]; then
        echo "check-sanitizers: build/lib/libfetchq.so not built (run: make lib)" >&2
        exit 2
    fi
}

c_asan() {
    need_lib
    local log=$LOGS/c-asan.log lib=$OUT/asan-lib t0 rc=0
    t0=$(now)
    mkdir -p "$lib"
    {
        # The library's Swift code instrumented too. A sanitized .so carries no
        # ASan runtime: it uses the executable's, so the harness must be linked
        # with the same toolchain's clang (not gcc's libasan).
        "$SWIFT" build "${RELEASE_FLAGS[@]}" -Xswiftc -sanitize=address --product fetchq \
            --scratch-path "$ROOT/.build-asan-lib" 2>&1 | grep -v "Cannot export local symbol" &&
        cp "$ROOT/.build-asan-lib/release/libfetchq.so" "$lib/$SONAME" &&
        ln -sf "$SONAME" "$lib/libfetchq.so" &&
        "$CLANG" -fuse-ld=lld "${CFLAGS_TEST[@]}" -fsanitize=address -fno-omit-frame-pointer Tests/c/*.c \
            -L"$lib" -lfetchq -ljansson -lpthread -Wl,-rpath,"$lib" -o "$OUT/c_harness_asan"
    } >"$log" 2>&1 || rc=2
    if [ $rc -eq 0 ]; then
        echo "== built in $(( $(now) - t0 )) s" >>"$log"
        local names=() name
        while read -r name; do
            case " $ASAN_SKIP " in *" $name "*) ;; *) names+=("$name") ;; esac
        done < <("$OUT/c_harness_asan" -l)
        ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 LSAN_OPTIONS=suppressions="$OUT/lsan.supp" \
            FQ_TEST_TIMEOUT_SCALE=${FQ_TEST_TIMEOUT_SCALE:-3} "$OUT/c_harness_asan" -n "${names[@]}" >>"$log" 2>&1 || rc=1
        grep -qE "==[0-9]+==ERROR: (Address|Leak)Sanitizer" "$log" && rc=1
    fi
    local tests skipped=""
    tests=$(grep -E "^[0-9]+ passed, [0-9]+ failed" "$log" | tail -1)
    [ -n "$ASAN_SKIP" ] && skipped=" (skipped: $ASAN_SKIP)"
    report c-asan $(( $(now) - t0 )) "$rc" "C harness: ${tests:-no summary}$skipped"
}

c_valgrind() {
    need_lib
    command -v "$VALGRIND" >/dev/null || { echo "check-sanitizers: valgrind not found" >&2; exit 2; }
    local log=$LOGS/c-valgrind.log lib=$OUT/valgrind-lib t0 rc=0
    t0=$(now)
    mkdir -p "$lib"
    # valgrind 3.19 cannot read the DWARF 5 of the Swift objects ("unhandled
    # dwarf2 abbrev form code 0x25"): use a copy without debug info, found
    # through LD_LIBRARY_PATH (which wins over the harness's RUNPATH).
    {
        objcopy --strip-debug "$BUILD/lib/libfetchq.so" "$lib/$SONAME" &&
        ${CC:-cc} "${CFLAGS_TEST[@]}" Tests/c/*.c -L"$BUILD/lib" -lfetchq -ljansson -lpthread \
            -Wl,-rpath,"$BUILD/lib" -o "$OUT/c_harness"
    } >"$log" 2>&1 || rc=2
    if [ $rc -eq 0 ]; then
        local tests=() name
        while read -r name; do
            case " $VALGRIND_SKIP " in *" $name "*) ;; *) tests+=("$name") ;; esac
        done < <("$OUT/c_harness" -l)
        # A test's child exits with 99 when valgrind found an error in it (a
        # definite leak counts), which the harness reports as a failure.
        LD_LIBRARY_PATH=$lib FQ_TEST_TIMEOUT_SCALE=${FQ_TEST_TIMEOUT_SCALE:-20} \
            "$VALGRIND" --leak-check=full --errors-for-leak-kinds=definite --show-leak-kinds=definite \
            --error-exitcode=99 --num-callers=30 "$OUT/c_harness" "${tests[@]}" >>"$log" 2>&1 || rc=1
        grep -qE "^FAIL " "$log" && rc=1
    fi
    local summary skipped=""
    summary=$(grep -E "^[0-9]+ passed, [0-9]+ failed" "$log" | tail -1)
    [ -n "$VALGRIND_SKIP" ] && skipped=" (skipped: $VALGRIND_SKIP)"
    report c-valgrind $(( $(now) - t0 )) "$rc" "C harness: ${summary:-no summary}$skipped"
    grep -E "^FAIL " "$log" | head -20 | sed 's/^/    /'
}

T0=$(now)
for s in "${steps[@]}"; do
    case "$s" in
    swift-tsan) swift_test swift-tsan thread "$ROOT/.build-tsan" ;;
    swift-asan) FETCHQ_JANSSON_CACHE=0 LSAN_OPTIONS=suppressions=$OUT/lsan.supp swift_test swift-asan address "$ROOT/.build-asan" ;;
    c-asan) FETCHQ_JANSSON_CACHE=0 c_asan ;;
    c-valgrind) FETCHQ_JANSSON_CACHE=0 c_valgrind ;;
    esac
done
echo "check-sanitizers: $(( $(now) - T0 )) s in all"
if [ ${#failed[@]} -gt 0 ]; then
    echo "check-sanitizers FAILED: ${failed[*]}"
    exit 1
fi
echo "check-sanitizers: no reports"
