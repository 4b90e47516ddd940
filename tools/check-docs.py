#!/usr/bin/env python3
"""Compiles or runs every code block in README.md and docs/*.md, so the docs
cannot rot. Fenced blocks are checked by their info string:

  ```c          compiled and linked against build/ (a block without main() is
                compiled only)
  ```c run      also run, with FETCHQ_URL set to a test server's base URL
  ```python     byte-compiled
  ```python run run with PYTHONPATH=bindings/python and FETCHQ_URL
  ```sh         syntax-checked with bash -n
  ```sh run     run with bash (FETCHQ_URL set; from the repository root)
  anything else (text, json, ...) is not code and is skipped.

Prints one line per block and ends with "N passed, N failed".
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)(?:[ \t]+(run))?[ \t]*$")


def blocks(path: Path):
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m and m.group(1):
            lang, run, start = m.group(1), m.group(2) == "run", i + 1
            j = start
            while j < len(lines) and lines[j].rstrip() != "```":
                j += 1
            yield lang, run, start + 1, "\n".join(lines[start:j]) + "\n"
            i = j + 1
        else:
            i += 1


class Server:
    """The shared test server, started on demand for `run` blocks."""

    def __init__(self) -> None:
        self.proc = None
        self.url = ""

    def start(self, tmp: Path) -> str:
        if self.proc is None:
            port_file = tmp / "port"
            self.proc = subprocess.Popen(
                [sys.executable, "-B", str(ROOT / "Tests/support/testserver.py"), "--port", "0",
                 "--port-file", str(port_file), "--parent-pid", str(os.getpid()), "--max-seconds", "600"],
                stdout=subprocess.DEVNULL)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not (port_file.exists() and port_file.read_text().strip()):
                time.sleep(0.05)
            self.url = "http://127.0.0.1:%s" % port_file.read_text().strip()
        return self.url

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def check(lang: str, run: bool, code: str, tmp: Path, server: Server) -> tuple[bool, str]:
    env = dict(os.environ)
    if run:
        env["FETCHQ_URL"] = server.start(tmp)
    if lang == "c":
        src = tmp / "block.c"
        src.write_text(code)
        exe = tmp / "block"
        has_main = re.search(r"\bint\s+main\s*\(", code) is not None
        cmd = ["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", "-I%s" % (BUILD / "include"), str(src)]
        cmd += (["-L%s" % (BUILD / "lib"), "-lfetchq", "-ljansson", "-lpthread", "-Wl,-rpath,%s" % (BUILD / "lib"), "-o", str(exe)]
                if has_main else ["-c", "-o", str(tmp / "block.o")])
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            return False, p.stderr
        if run:
            p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env)
            return p.returncode == 0, p.stdout + p.stderr
        return True, ""
    if lang == "python":
        src = tmp / "block.py"
        src.write_text(code)
        if not run:
            p = subprocess.run([sys.executable, "-m", "py_compile", str(src)], capture_output=True, text=True)
            return p.returncode == 0, p.stderr
        env["PYTHONPATH"] = str(ROOT / "bindings/python")
        env.setdefault("FETCHQ_LIBRARY", str(BUILD / "lib/libfetchq.so.0"))
        p = subprocess.run([sys.executable, "-B", str(src)], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
        return p.returncode == 0, p.stdout + p.stderr
    if lang in ("sh", "bash", "shell"):
        src = tmp / "block.sh"
        src.write_text(code)
        p = subprocess.run(["bash", "-n" if not run else "-e", str(src)], capture_output=True, text=True,
                           timeout=300, env=env, cwd=ROOT)
        return p.returncode == 0, p.stdout + p.stderr
    return True, "skipped"


def main() -> int:
    files = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
    passed = failed = 0
    server = Server()
    try:
        with tempfile.TemporaryDirectory(prefix="fetchq-docs-") as t:
            tmp = Path(t)
            for path in files:
                for lang, run, line, code in blocks(path):
                    if lang not in ("c", "python", "sh", "bash", "shell"):
                        continue
                    ok, output = check(lang, run, code, tmp, server)
                    where = "%s:%d (%s%s)" % (path.relative_to(ROOT), line, lang, " run" if run else "")
                    if ok:
                        passed += 1
                        print("ok      %s" % where)
                    else:
                        failed += 1
                        print("FAILED  %s\n%s" % (where, "\n".join("    | " + l for l in output.splitlines()[-30:])))
    finally:
        server.stop()
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
