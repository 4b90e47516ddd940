#!/usr/bin/env bash
# Builds and runs the libFuzzer targets (docs/reliability.md, "Fuzzing").
#
#   bash fuzz/run.sh fuzz [TARGET...]    fuzz each target for FUZZ_SECONDS (default 60)
#   bash fuzz/run.sh replay [TARGET...]  run every regression input and seed once
#
# TARGET: config, search, response (default: all three).
#
# fuzz: builds fuzz/ with -sanitize=fuzzer,address (release, scratch fuzz/.build),
# runs each target on a working corpus fuzz/.work/corpus/TARGET seeded from
# fuzz/corpus/TARGET and, for search and response, ../shared/data/JSONTestSuite/
# test_parsing. A crash or failed oracle is saved under fuzz/.work/crashes/ and
# fails the run (exit 1); turn it into a regression input with the printed steps.
# Prints one line per target: runs, runs/s, coverage, corpus growth, peak RSS.
# Environment: FUZZ_SECONDS, FUZZ_JOBS (parallel targets, default 1),
# FUZZ_ARGS (extra libFuzzer flags), FETCHQ_FUZZ_KNOWN_BUGS (see KnownBugs.swift).
#
# replay: builds fuzz/ without the fuzzer but with AddressSanitizer (debug,
# scratch fuzz/.build-replay) and runs Tests/fuzz-regressions/TARGET/*,
# fuzz/corpus/TARGET/* and (every target but config) the JSONTestSuite files, which
# must be there beside the clone, through the
# same target code once each; exits 1 if one fails. Used by `make test` (target
# test-fuzz-regressions).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FUZZ=$ROOT/fuzz
SWIFT=${SWIFT:-swift}
ALL_TARGETS=(config search response)
SUITE=$ROOT/../shared/data/JSONTestSuite/test_parsing
# Swift's own crash backtracer would run inside the ASan process and trip it; let
# libFuzzer and ASan report crashes.
export SWIFT_BACKTRACE=enable=no

mode=${1:-}
[ $# -gt 0 ] && shift
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
    case " ${ALL_TARGETS[*]} " in *" $t "*) ;; *) echo "fuzz/run.sh: unknown target $t" >&2; exit 2 ;; esac
done

now() { date +%s; }

# swift build with the noise filtered out; fails (exit 1) when the build fails.
# A failed build must not fall through to binaries left from an earlier one.
build() {
    local log status
    log=$(mktemp)
    set +e
    "$SWIFT" build "$@" >"$log" 2>&1
    status=$?
    set -e
    grep -v "Cannot export local symbol" "$log" | grep -E "error|warning: |Build complete" | grep -v '^\[' || true
    rm -f "$log"
    if [ $status -ne 0 ]; then
        echo "fuzz/run.sh: swift build failed (exit $status)" >&2
        exit 1
    fi
}

# SwiftPM does not notice a file added to or removed from the root package (a
# path dependency of fuzz/) in a scratch directory it has built before: the
# build then fails with "cannot find 'X' in scope" until the directory is
# removed. The list of the root package's source files is kept with each
# scratch directory; when it has changed, the directory is built afresh.
fresh_scratch() {
    local scratch=$1 list
    list=$(cd "$ROOT" && find Sources -type f \( -name '*.swift' -o -name '*.c' -o -name '*.h' \) | LC_ALL=C sort)
    if [ -d "$scratch" ] && [ "$list" != "$(cat "$scratch/.fetchq-sources" 2>/dev/null)" ]; then
        echo "fuzz/run.sh: files were added to or removed from Sources since $scratch was built: building afresh"
        rm -rf "$scratch"
    fi
    mkdir -p "$scratch"
    printf '%s' "$list" >"$scratch/.fetchq-sources"
}

case "$mode" in
fuzz)
    seconds=${FUZZ_SECONDS:-60}
    jobs=${FUZZ_JOBS:-1}
    t0=$(now)
    echo "building the fuzzers (release, -sanitize=fuzzer,address)..."
    fresh_scratch "$FUZZ/.build"
    build --package-path "$FUZZ" --scratch-path "$FUZZ/.build" -c release \
        -Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING
    bin=$("$SWIFT" build --package-path "$FUZZ" --scratch-path "$FUZZ/.build" -c release --show-bin-path)
    for t in "${targets[@]}"; do
        [ -x "$bin/fuzz-$t" ] || { echo "fuzz/run.sh: $bin/fuzz-$t was not built" >&2; exit 2; }
    done
    echo "built in $(( $(now) - t0 )) s; fuzzing ${targets[*]} for $seconds s each"
    mkdir -p "$FUZZ/.work/crashes" "$FUZZ/.work/logs"
    run_one() {
        local t=$1 work=$FUZZ/.work/corpus/$1 log=$FUZZ/.work/logs/$1.log
        mkdir -p "$work"
        local seeds=("$FUZZ/corpus/$t")
        local max_len=16384
        if [ "$t" = config ]; then max_len=4096; elif [ -d "$SUITE" ]; then seeds+=("$SUITE"); fi
        # shellcheck disable=SC2086
        "$bin/fuzz-$t" "$work" "${seeds[@]}" -max_total_time="$seconds" -max_len=$max_len \
            -timeout=30 -print_final_stats=1 -artifact_prefix="$FUZZ/.work/crashes/$t-" \
            ${FUZZ_ARGS:-} >"$log" 2>&1
    }
    failed=0
    pids=()
    for t in "${targets[@]}"; do
        if [ "$jobs" -gt 1 ]; then
            run_one "$t" & pids+=($!)
            [ ${#pids[@]} -ge "$jobs" ] && { wait "${pids[0]}" || true; pids=("${pids[@]:1}"); }
        else
            run_one "$t" || true
        fi
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
    for t in "${targets[@]}"; do
        log=$FUZZ/.work/logs/$t.log
        stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
        cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2 || true)
        printf '%-9s %9s runs  %6s/s  cov %5s  +%s corpus units  peak RSS %s MB\n' "$t" \
            "$(stat number_of_executed_units)" "$(stat average_exec_per_sec)" "${cov:-?}" \
            "$(stat new_units_added)" "$(stat peak_rss_mb)" || true
        if grep -qE "ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer)|fuzz oracle failed|Fatal error" "$log"; then
            failed=1
            echo "  FINDING in $t (log: ${log#"$ROOT"/}):"
            grep -E "fuzz oracle failed|Fatal error|ERROR: |SUMMARY: |Test unit written" "$log" | head -8 | sed 's/^/    /'
        fi
    done
    if [ "$failed" = 1 ]; then
        cat <<HINT
To turn a crash into a regression input:
  $bin/fuzz-TARGET -minimize_crash=1 -runs=20000 -exact_artifact_path=Tests/fuzz-regressions/TARGET/NAME fuzz/.work/crashes/TARGET-crash-...
then check that 'bash fuzz/run.sh replay TARGET' fails on it until the engine is fixed.
HINT
        exit 1
    fi
    echo "no findings ($(( $(now) - t0 )) s in all)"
    ;;
replay)
    # make test replays the JSONTestSuite too (README, "Set up"): without it
    # the replay would pass on less than it claims.
    if [ ! -d "$SUITE" ]; then echo "replay: JSONTestSuite not found at $SUITE" >&2; exit 1; fi
    t0=$(now)
    fresh_scratch "$FUZZ/.build-replay"
    build --package-path "$FUZZ" --scratch-path "$FUZZ/.build-replay" --sanitize=address
    bin=$("$SWIFT" build --package-path "$FUZZ" --scratch-path "$FUZZ/.build-replay" --sanitize=address --show-bin-path)
    built=$(now)
    failed=""
    for t in "${targets[@]}"; do
        inputs=("$FUZZ/corpus/$t")
        [ -d "$ROOT/Tests/fuzz-regressions/$t" ] && inputs=("$ROOT/Tests/fuzz-regressions/$t" "${inputs[@]}")
        [ "$t" != config ] && inputs+=("$SUITE")
        if ! "$bin/fuzz-$t" "${inputs[@]}"; then failed="$failed $t"; fi
    done
    echo "replay: built in $(( built - t0 )) s, ran in $(( $(now) - built )) s"
    if [ -n "$failed" ]; then echo "replay FAILED:$failed"; exit 1; fi
    ;;
*)
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
