#!/usr/bin/env python3
"""P3's anchor: runs wrk against URL with C connections for S seconds and
prints its result as JSON like the other benchmark programs.

  wrk_json.py URL C SECONDS
"""
import json
import re
import subprocess
import sys


def main() -> None:
    url, c, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cmd = ["wrk", "-t2", f"-c{c}", f"-d{seconds}s", "--latency", url]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    if re.search(r"Non-2xx or 3xx responses|Socket errors", text):
        sys.exit("wrk reported errors:\n" + text)
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
    n = int(re.search(r"(\d+) requests in", text).group(1))
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", text, re.M))
    print(json.dumps({"bench": "wrk", "cmd": " ".join(cmd), "n": n, "concurrency": c, "rate": rate,
                      "latency_p50": lat.get("50"), "latency_p99": lat.get("99")}))


if __name__ == "__main__":
    main()
