#!/usr/bin/env bash
# bench/run.sh — what `make bench` runs (after `make lib`): installs what is
# missing, builds the benchmark programs, starts nginx, runs every benchmark
# as rounds of alternating runs (anchor, fetchq, anchor, fetchq, ...), and
# writes BENCHMARKS.md with bench/report.py.
#
# Knobs (environment): PAIRS (rounds per benchmark, default 3), P1_N
# (1000000), P1_CHAIN_N (20000), P2_N (50000), P4_N (50000: fetchq and
# aiohttp), P4_HTTPX_N (10000: httpx, at 0.5-2 k req/s here), P5_N and P6_N
# (100000), P7_N (5000), WRK_SECONDS (5), BENCH_OUT (BENCHMARKS.md).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build
OUT=$BUILD/bench
PAIRS=${PAIRS:-3}
P1_N=${P1_N:-1000000}
P1_CHAIN_N=${P1_CHAIN_N:-20000}
P2_N=${P2_N:-50000}
P4_N=${P4_N:-50000}
P4_HTTPX_N=${P4_HTTPX_N:-10000}
P5_N=${P5_N:-100000}
P6_N=${P6_N:-100000}
P7_N=${P7_N:-5000}
WRK_SECONDS=${WRK_SECONDS:-5}
RESULTS=$OUT/results.jsonl
META=$OUT/meta.json
started=$(date +%s)

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# ---- what is missing -------------------------------------------------------

install_deps() {
    local missing=""
    command -v wrk >/dev/null || missing="$missing wrk"
    command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing="$missing nginx-light"
    for p in libcurl4-openssl-dev libjansson-dev pkg-config; do
        dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        log "installing (apt):$missing"
        local sudo=""
        [ "$(id -u)" = 0 ] || sudo=sudo
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
    fi
    local pymissing=""
    python3 -c 'import aiohttp' 2>/dev/null || pymissing="$pymissing aiohttp"
    python3 -c 'import httpx' 2>/dev/null || pymissing="$pymissing httpx"
    if [ -n "$pymissing" ]; then
        log "installing (pip):$pymissing"
        python3 -m pip install --quiet $pymissing 2>/dev/null ||
            python3 -m pip install --quiet --user $pymissing
    fi
}

# ---- builds ----------------------------------------------------------------

build() {
    mkdir -p "$OUT"
    local cflags="-std=c11 -O2 -g -Wall -Wextra -Werror"
    log "building bench/fq_bench.c, bench/curl_jansson_client.c and bench/bare_queue.c (-O2)"
    cc $cflags -I"$BUILD/include" "$ROOT/bench/fq_bench.c" -L"$BUILD/lib" -lfetchq -ljansson -lpthread \
        -Wl,-rpath,"$BUILD/lib" -o "$OUT/fq_bench"
    cc $cflags "$ROOT/bench/curl_jansson_client.c" -lcurl -ljansson -lpthread -o "$OUT/curl_jansson_client"
    cc $cflags "$ROOT/bench/bare_queue.c" -lpthread -o "$OUT/bare_queue"
    cc $cflags -I"$ROOT/Sources/CFetchQSupport/include" "$ROOT/bench/jansson_parse.c" \
        "$ROOT/Sources/CFetchQSupport/json_walk.c" -ljansson \
        -o "$OUT/jansson_parse"
    log "building the Foundation anchors (bench/anchors, swift build -c release)"
    swift build -c release --package-path "$ROOT/bench/anchors" --scratch-path "$OUT/anchors" 2>&1 | tail -1 >&2
    ANCHORS=$(swift build -c release --package-path "$ROOT/bench/anchors" --scratch-path "$OUT/anchors" \
        --show-bin-path)/anchors
    FQ=$OUT/fq_bench
    CURLJ=$OUT/curl_jansson_client
    # The Python binding, straight from the tree, on the library just built.
    export PYTHONPATH=$ROOT/bindings/python${PYTHONPATH:+:$PYTHONPATH}
    export FETCHQ_LIBRARY=$BUILD/lib/libfetchq.so.0
}

# ---- nginx -----------------------------------------------------------------

NGINX_PID=""
TMP=""
cleanup() {
    if [ -n "$NGINX_PID" ] && kill -0 "$NGINX_PID" 2>/dev/null; then
        kill "$NGINX_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$NGINX_PID" 2>/dev/null || break; sleep 0.1; done
    fi
    [ -n "$TMP" ] && rm -rf "$TMP"
}
trap cleanup EXIT

start_nginx() {
    TMP=$(mktemp -d /tmp/fetchq-bench.XXXXXX)
    chmod 755 "$TMP"  # nginx workers run as another user when we are root
    mkdir -p "$TMP/www"
    DOC_BYTES=$(python3 "$ROOT/bench/gen_data.py" "$TMP/www" "$P7_N")
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    NGINX_WORKERS=1
    sed -e "s|@PORT@|$PORT|g" -e "s|@ROOT@|$TMP/www|g" -e "s|@TMP@|$TMP|g" -e "s|@WORKERS@|$NGINX_WORKERS|g" \
        "$ROOT/bench/nginx.conf.in" > "$TMP/nginx.conf"
    local nginx
    nginx=$(command -v nginx || echo /usr/sbin/nginx)
    "$nginx" -p "$TMP" -c "$TMP/nginx.conf" -e "$TMP/error.log" &
    NGINX_PID=$!
    for _ in $(seq 100); do
        curl -sf -o /dev/null "http://127.0.0.1:$PORT/doc.json" && break
        sleep 0.1
    done
    curl -sf -o /dev/null "http://127.0.0.1:$PORT/s/q0%20%C3%BC.json?x=1" || { log "nginx did not start"; cat "$TMP/error.log" >&2; exit 1; }
    DOC_URL=http://127.0.0.1:$PORT/doc.json
    SEARCH_TEMPLATE="http://127.0.0.1:$PORT/s/{query}.json"
    log "nginx $NGINX_PID on 127.0.0.1:$PORT ($NGINX_WORKERS worker), document $DOC_BYTES bytes"
}

# ---- running ---------------------------------------------------------------

# record ID SIDE ROUND CMD... — runs CMD, appends its JSON (last stdout line)
# to results.jsonl; a failure is recorded as an error, not a number.
record() {
    local id=$1 side=$2 round=$3
    shift 3
    local cmd="$*" out rc=0 t0 t1
    t0=$(date +%s.%N)
    out=$(timeout 900 "$@" 2>"$OUT/last.err") || rc=$?
    t1=$(date +%s.%N)
    local line
    line=$(printf '%s\n' "$out" | tail -n 1)
    python3 - "$id" "$side" "$round" "$cmd" "$rc" "$line" "$OUT/last.err" "$t0" "$t1" >>"$RESULTS" <<'EOF'
import json, sys
id_, side, rnd, cmd, rc, line, errfile, t0, t1 = sys.argv[1:]
rec = {"id": id_, "side": side, "round": int(rnd), "cmd": cmd, "wall": float(t1) - float(t0)}
try:
    rec["result"] = json.loads(line) if rc == "0" else None
except ValueError:
    rec["result"] = None
if rec["result"] is None:
    rec["error"] = ("exit %s: " % rc) + open(errfile, errors="replace").read()[-600:]
print(json.dumps(rec))
EOF
    if [ "$rc" != 0 ]; then log "  $id $side round $round FAILED (exit $rc): $(tail -c 300 "$OUT/last.err")"; else
        log "  $id $side round $round: $(printf '%s' "$line" | cut -c1-160)"; fi
}

# Each round's runs are listed with `plan` (the arguments of `record`) and
# run by `run_round ROUND`: in odd rounds in the order listed, in even rounds
# in reverse, so that a drift of the machine within a round does not always
# fall on the same side (the anchor used to run first in every round).
PLANNED=()
plan() { PLANNED+=("$(printf '%q ' "$@")"); }
run_round() {
    local i
    if (( $1 % 2 == 1 )); then
        for ((i = 0; i < ${#PLANNED[@]}; i++)); do eval "record ${PLANNED[i]}"; done
    else
        for ((i = ${#PLANNED[@]} - 1; i >= 0; i--)); do eval "record ${PLANNED[i]}"; done
    fi
    PLANNED=()
}

# Config "delivery": "inline" (callbacks on the worker that ended the
# operation when nothing else is being delivered) for the second fetchq side
# of P2 and P7.
INLINE='{"delivery":"inline"}'

run_all() {
    : >"$RESULTS"
    local r
    log "P1: no-op ops, queue max 2 (rounds of: OperationQueue, fetchq, and a bare C queue for plain)"
    for variant in plain prio chain; do
        local n=$P1_N
        [ "$variant" = chain ] && n=$P1_CHAIN_N
        for r in $(seq "$PAIRS"); do
            plan "P1-$variant" anchor "$r" "$ANCHORS" p1 "$variant" "$n"
            plan "P1-$variant" fetchq "$r" "$FQ" p1 "$variant" "$n"
            # The ceiling: a bare mutex-and-FIFO queue in C, 2 threads.
            if [ "$variant" = plain ]; then plan "P1-$variant" bare "$r" "$OUT/bare_queue" "$n"; fi
            run_round "$r"
        done
    done
    record "P1-chain-1M" fetchq 1 "$FQ" p1 chain "$P1_N"

    # The floor under P2-P4: jansson's CPU time for one parse of the document.
    record parse info 1 "$OUT/jansson_parse" "$TMP/www/doc.json" 20000
    record parse-search info 1 "$OUT/jansson_parse" "$TMP/www/s/q1 ü.json" 20000

    log "P2/P3: GET + JSON parse from nginx (rounds of: curl+jansson, wrk, fetchq, fetchq inline, curl+jansson on 2 threads, curl on 2 threads without the parse; fetchq's latency: all at once, and at most 2C in the engine)"
    for c in 8 64; do
        for r in $(seq "$PAIRS"); do
            plan "P2-c$c" anchor "$r" "$CURLJ" "$DOC_URL" "$P2_N" "$c"
            plan "P3-c$c" anchor "$r" python3 -B "$ROOT/bench/wrk_json.py" "$DOC_URL" "$c" "$WRK_SECONDS"
            plan "P2-c$c" fetchq "$r" "$FQ" p2 "$DOC_URL" "$P2_N" "$c"
            plan "P2-c$c" fetchq-inline "$r" env "FQ_BENCH_CONFIG=$INLINE" "$FQ" p2 "$DOC_URL" "$P2_N" "$c"
            # The ceiling: the same C client on 2 threads (each a multi handle, C/2 connections).
            plan "P2-c$c" curlj2 "$r" "$CURLJ" "$DOC_URL" "$P2_N" "$c" items 2
            # The ceiling of any libcurl client (P3): the same, without the parse.
            plan "P2-c$c" curlget2 "$r" "$CURLJ" "$DOC_URL" "$P2_N" "$c" - 2
            # Latency, from runs of their own (FQ_BENCH_LATENCY=1: each callback
            # reads its result's metrics; the rate runs above read nothing, like
            # the anchors). All N submitted at once, so queue wait is the backlog:
            plan "P2l-c$c" fetchq "$r" env FQ_BENCH_LATENCY=1 "$FQ" p2 "$DOC_URL" "$P2_N" "$c"
            # and steady state: at most 2C requests in the engine at a time.
            # In every round, like the rest: one run alone can land in a slow phase.
            plan "P2w-c$c" fetchq "$r" env FQ_BENCH_LATENCY=1 FQ_BENCH_WINDOW=$((2 * c)) "$FQ" p2 "$DOC_URL" "$P2_N" "$c"
            run_round "$r"
        done
    done

    log "P4: from Python asyncio (rounds of: aiohttp, httpx, fetchq binding)"
    for c in 8 64; do
        for r in $(seq "$PAIRS"); do
            plan "P4-c$c" aiohttp "$r" python3 -B "$ROOT/bench/py_bench.py" aiohttp "$DOC_URL" "$P4_N" "$c"
            plan "P4-c$c" httpx "$r" python3 -B "$ROOT/bench/py_bench.py" httpx "$DOC_URL" "$P4_HTTPX_N" "$c"
            plan "P4-c$c" fetchq "$r" python3 -B "$ROOT/bench/py_bench.py" fetchq "$DOC_URL" "$P4_N" "$c"
            run_round "$r"
        done
    done

    log "P5/P6: memory per queued op, cancel-all"
    for r in $(seq "$PAIRS"); do
        record P5-block fetchq "$r" "$FQ" p5 block "$P5_N"
        record P5-request fetchq "$r" "$FQ" p5 request "$P5_N" "$DOC_URL"
        record P6 fetchq "$r" "$FQ" p6 "$P6_N"
    done

    log "P7: searches, max_concurrent 8 (rounds of: OperationQueue+URLSession+JSONSerialization, curl+jansson on 1 and 2 threads, fetchq, fetchq inline, fetchq's latency)"
    for r in $(seq "$PAIRS"); do
        plan P7 anchor "$r" "$ANCHORS" p7 "$SEARCH_TEMPLATE" "$P7_N" 8
        # The ceiling: the C client GETting and parsing one search document.
        plan P7 curlj "$r" "$CURLJ" "${SEARCH_TEMPLATE/\{query\}/q1%20%C3%BC}" "$P7_N" 8 results
        plan P7 curlj2 "$r" "$CURLJ" "${SEARCH_TEMPLATE/\{query\}/q1%20%C3%BC}" "$P7_N" 8 results 2
        plan P7 fetchq "$r" "$FQ" p7 "$SEARCH_TEMPLATE" "$P7_N" 8
        plan P7 fetchq-inline "$r" env "FQ_BENCH_CONFIG=$INLINE" "$FQ" p7 "$SEARCH_TEMPLATE" "$P7_N" 8
        # Latency, from a run of its own (the rate runs read no metrics).
        plan P7l fetchq "$r" env FQ_BENCH_LATENCY=1 "$FQ" p7 "$SEARCH_TEMPLATE" "$P7_N" 8
        run_round "$r"
    done
}

meta() {
    python3 - "$META" <<EOF
import json, sys
json.dump({"pairs": $PAIRS, "p1_n": $P1_N, "p1_chain_n": $P1_CHAIN_N, "p2_n": $P2_N, "p4_n": $P4_N, "p4_httpx_n": $P4_HTTPX_N,
           "p5_n": $P5_N, "p6_n": $P6_N, "p7_n": $P7_N, "wrk_seconds": $WRK_SECONDS,
           "doc_bytes": $DOC_BYTES, "nginx_workers": $NGINX_WORKERS,
           "load_start": "$LOAD_START", "load_end": "$(cut -d' ' -f1-3 /proc/loadavg)",
           "seconds": $(date +%s) - $started, "anchors": "$ANCHORS",
           "commit": "$BENCH_COMMIT", "dirty": $BENCH_DIRTY}, open(sys.argv[1], "w"))
EOF
}

install_deps
# The commit measured (the report may be regenerated later, at another one).
BENCH_COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "?")
BENCH_DIRTY=False
if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no -- Sources include 2>/dev/null)" ]; then
    BENCH_DIRTY=True
fi
build
start_nginx
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
run_all
meta
python3 "$ROOT/bench/report.py" --results "$RESULTS" --meta "$META" --root "$ROOT" \
    --out "${BENCH_OUT:-$ROOT/BENCHMARKS.md}"
# The raw records stay with the report they made (committed with it), so
# that every figure in BENCHMARKS.md can be recomputed later.
if [ -z "${BENCH_OUT:-}" ]; then
    mkdir -p "$ROOT/bench/results"
    cp "$RESULTS" "$ROOT/bench/results/results.jsonl"
    cp "$META" "$ROOT/bench/results/meta.json"
fi
log "done in $(( $(date +%s) - started )) s: ${BENCH_OUT:-$ROOT/BENCHMARKS.md}"
