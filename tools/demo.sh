#!/usr/bin/env bash
# make demo: start the demo search server on loopback, build and run
# examples/search_tags.c against it, stop the server. Exits with the
# example's status. Needs `make lib` first (the Makefile's demo target does it).
#
#   bash tools/demo.sh [TAG...]     (tags are passed to the example)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build
EXE=$BUILD/examples/search_tags
PYTHON=${PYTHON:-python3}
CC=${CC:-cc}

say() { printf '\n==> %s\n' "$*"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

# shellcheck source=tools/common.sh
. "$ROOT/tools/common.sh"
check_prerequisites
make_workdir demo

say "starting the demo search server (Tests/support/testserver.py --corpus demo) on 127.0.0.1"
start_test_server demo 600
echo "    $URL (pid $server_pid): 400 posts, 50 authors, 15 tags; GET /search?q=TAG&rpp=N"

say "building examples/search_tags.c against build/lib/libfetchq.so"
mkdir -p "$BUILD/examples"
PKG=$(PKG_CONFIG_PATH="$BUILD/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}" \
    pkg-config --cflags --libs fetchq) || die "pkg-config --cflags --libs fetchq failed"
# $PKG is a list of flags: split on purpose.
# shellcheck disable=SC2206
CMD=("$CC" -std=c11 -O2 -Wall -Wextra -Werror examples/search_tags.c $PKG -lpthread
     -Wl,-rpath,"$BUILD/lib" -o build/examples/search_tags)
echo "    ${CMD[*]}"
(cd "$ROOT" && "${CMD[@]}")

say "running: build/examples/search_tags $URL${*:+ $*}"
status=0
"$EXE" "$URL" "$@" || status=$?

# The same job from the shell: the fetchq CLI, merged and sorted. Its
# progress bar shows on stderr when that is a terminal.
CLI=$BUILD/bin/fetchq
if [ -x "$CLI" ]; then
    tags=("$@")
    [ ${#tags[@]} -gt 0 ] || tags=(swift rust go concurrency security)
    say "the CLI: fetchq search --merged ${tags[*]} (the 5 newest of the merged items)"
    cli_status=0
    "$CLI" search --url "$URL/search?q={query}&rpp=50" --results /results --id /id \
        --sort /created_at --order desc --concurrency 2 --merged "${tags[@]}" >"$WORK/cli.jsonl" || cli_status=$?
    head -n 5 "$WORK/cli.jsonl" | cut -c1-160
    echo "    ... $(wc -l <"$WORK/cli.jsonl") merged items as JSON lines (exit status $cli_status)"
    [ "$cli_status" -eq 0 ] || status=$cli_status
else
    echo "demo: $CLI is missing (make lib builds it)" >&2
    status=1
fi

say "stopping the server (pid $server_pid); exit status $status"
exit "$status"
