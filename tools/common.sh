# Shared by tools/demo.sh and tools/run-examples.sh (sourced, not run).
# Expects ROOT, BUILD, PYTHON, CC and a die() function.

# Python, a C compiler (cc, else clang), pkg-config and the built library.
check_prerequisites() {
    command -v "$PYTHON" >/dev/null || die "$PYTHON not found (install python3 >= 3.11)"
    if ! command -v "$CC" >/dev/null; then
        command -v clang >/dev/null || die "no C compiler: $CC and clang not found"
        CC=clang
    fi
    command -v pkg-config >/dev/null || die "pkg-config not found (run: make lib)"
    [ -e "$BUILD/lib/libfetchq.so" ] && [ -e "$BUILD/lib/pkgconfig/fetchq.pc" ] ||
        die "build/lib/libfetchq.so not built (run: make lib)"
}

# A work directory WORK, removed on exit with the server (if started).
make_workdir() {  # name
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/fetchq-$1.XXXXXX")
    server_pid=""
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

cleanup() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}

# Starts Tests/support/testserver.py with the given corpus on 127.0.0.1 and
# sets URL and server_pid. --parent-pid: it also exits if this script dies.
start_test_server() {  # corpus max-seconds
    "$PYTHON" "$ROOT/Tests/support/testserver.py" --corpus "$1" --host 127.0.0.1 --port 0 \
        --port-file "$WORK/port" --parent-pid $$ --max-seconds "$2" \
        >"$WORK/server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 100); do # at most 10 s
        [ -s "$WORK/port" ] && break
        kill -0 "$server_pid" 2>/dev/null || { cat "$WORK/server.log" >&2; die "the server exited"; }
        sleep 0.1
    done
    [ -s "$WORK/port" ] || { cat "$WORK/server.log" >&2; die "the server did not start within 10 s"; }
    URL="http://127.0.0.1:$(cat "$WORK/port")"
}
