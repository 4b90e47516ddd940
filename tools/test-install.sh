#!/usr/bin/env bash
# make install into a temporary DESTDIR; build every C example with only
# `pkg-config --cflags --libs fetchq`; run one against the installed library;
# make uninstall; check nothing of ours is left.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(mktemp -d /tmp/fetchq-install-XXXXXX)
server_pid=""
cleanup() {
    [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
    rm -rf "$root"
}
trap cleanup EXIT

prefix=/usr/local
make --no-print-directory install DESTDIR="$root/dest" PREFIX="$prefix" >/dev/null
lib="$root/dest$prefix/lib"
for f in libfetchq.so libfetchq.so.0 pkgconfig/fetchq.pc; do
    [ -e "$lib/$f" ] || { echo "install: missing $lib/$f"; exit 1; }
done
soname=$(readelf -d "$lib/libfetchq.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = libfetchq.so.0 ] || { echo "install: soname is '$soname'"; exit 1; }

# The .pc file names the real prefix; PKG_CONFIG_SYSROOT_DIR maps it into DESTDIR.
export PKG_CONFIG_PATH="$lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$root/dest"
flags=$(pkg-config --cflags --libs fetchq)
passed=0
failed=0
mkdir -p "$root/bin"
for src in examples/*.c; do
    name=$(basename "$src" .c)
    if cc -std=c11 -Wall -Wextra -Werror "$src" $flags -lpthread -o "$root/bin/$name"; then
        passed=$((passed + 1))
    else
        echo "install: $src does not build with pkg-config flags: $flags"
        failed=$((failed + 1))
    fi
done

# Run the pipeline example against the installed library only.
python3 -B Tests/support/testserver.py --port 0 --port-file "$root/port" --parent-pid $$ --max-seconds 120 >/dev/null &
server_pid=$!
for _ in $(seq 1 100); do [ -s "$root/port" ] && break; sleep 0.1; done
port=$(cat "$root/port")
if LD_LIBRARY_PATH="$lib" "$root/bin/pipeline" "http://127.0.0.1:$port" "$root/store.db" >"$root/pipeline.log" 2>&1 \
   && LD_LIBRARY_PATH="$lib" ldd "$root/bin/pipeline" | grep -q "$lib/libfetchq.so.0"; then
    passed=$((passed + 1))
else
    echo "install: the pipeline example failed against the installed library:"
    cat "$root/pipeline.log"
    failed=$((failed + 1))
fi

make --no-print-directory uninstall DESTDIR="$root/dest" PREFIX="$prefix" >/dev/null
left=$(find "$root/dest" -type f -o -type l | grep -i fetchq || true)
if [ -n "$left" ]; then
    echo "uninstall left: $left"
    failed=$((failed + 1))
else
    passed=$((passed + 1))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
