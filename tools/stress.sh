#!/usr/bin/env bash
# Runs the exactly-once stress program (tools/stress.c, built by make into
# build/tools/stress) against the shared test server, under a hard time limit.
#
#   tools/stress.sh [stress options...]      e.g. --ops 50000, --seed 7
#
# Environment: FQ_STRESS_BIN (default build/tools/stress), FQ_STRESS_TIMEOUT
# (seconds, default 1800). The program starts and stops the test server itself
# (with --parent-pid, so the server never outlives it) and prints
# "N passed, N failed"; the exit status is non-zero if a check failed, the
# program crashed, or it ran out of time.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${FQ_STRESS_BIN:-$root/build/tools/stress}
limit=${FQ_STRESS_TIMEOUT:-1800}

if [[ ! -x $bin ]]; then
    echo "stress.sh: $bin not found; build it with: make stress" >&2
    exit 2
fi

FQ_REPO_ROOT=$root timeout --kill-after=10 "$limit" "$bin" --repo "$root" "$@"
rc=$?
case $rc in
    0) ;;
    124 | 137) echo "stress.sh: FAILED: still running after ${limit} s (killed)" >&2 ;;
    *) if ((rc > 128)); then echo "stress.sh: FAILED: killed by signal $((rc - 128))" >&2; fi ;;
esac
exit $rc
