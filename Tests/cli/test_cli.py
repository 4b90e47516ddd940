"""Tests of the fetchq CLI (Sources/fetchq-cli), run as a subprocess against
the shared test server (Tests/support/testserver.py).

The binary is $FETCHQ_CLI, else .build/debug/fetchq-cli (build it with
`swift build --product fetchq-cli`).

    python3 -m pytest -q Tests/cli/test_cli.py
"""

from __future__ import annotations

import base64
import json
import os
import pty
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "Tests" / "support" / "testserver.py"
DOCS = ROOT / "docs" / "cli.md"
DOC_PORT = "8000"  # the port the examples in docs/cli.md and --help use


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def cli() -> str:
    path = os.environ.get("FETCHQ_CLI") or str(ROOT / ".build" / "debug" / "fetchq-cli")
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} not found: build it with `swift build --product fetchq-cli` or set FETCHQ_CLI")
    return os.path.abspath(path)  # the examples run it through a symlink in another directory


@pytest.fixture(scope="module")
def server():
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        proc = subprocess.Popen(
            [sys.executable, str(SERVER), "--port", "0", "--port-file", port_file,
             "--parent-pid", str(os.getpid()), "--max-seconds", "900"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            line = proc.stdout.readline()
            assert line.startswith(b"PORT "), line
            yield f"http://127.0.0.1:{int(line.split()[1])}"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def stats(base: str) -> dict:
    return get_json(base + "/stats")


def reset(base: str) -> None:
    get_json(base + "/stats/reset")


def run(cli: str, *args: str, input: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([cli, *args], input=input, capture_output=True, timeout=timeout)


def lines(out: bytes) -> list:
    return [json.loads(l) for l in out.decode().splitlines()]


def wait_for(predicate, what: str, seconds: float = 10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def search_url(base: str) -> str:
    return base + "/search?q={query}&rpp=500"


def corpus(base: str, tag: str) -> list:
    return get_json(f"{base}/corpus?tag={tag}")["results"]


def newest_first(items: list) -> list:
    return sorted(items, key=lambda i: i["created_at"], reverse=True)


# ---------------------------------------------------------------- search


def test_search_per_query_matches_corpus(cli, server):
    r = run(cli, "search", "--url", search_url(server), "--results", "/results",
            "--sort", "/created_at", "swift", "rust", "json")
    assert r.returncode == 0, r.stderr
    assert r.stderr == b""
    got = {l["query"]: l for l in lines(r.stdout)}
    assert sorted(got) == ["json", "rust", "swift"]
    for tag, line in got.items():
        expected = newest_first(corpus(server, tag))
        assert line["count"] == len(expected) > 0
        assert line["items"] == expected
        assert list(line) == ["query", "count", "items"]


def test_search_order_asc(cli, server):
    r = run(cli, "search", "--url", search_url(server), "--results", "/results",
            "--sort", "/created_at", "--order", "asc", "go")
    assert r.returncode == 0, r.stderr
    [line] = lines(r.stdout)
    assert line["items"] == sorted(corpus(server, "go"), key=lambda i: i["created_at"])


def merge(per_query: list) -> list:
    """De-duplicate by id (first occurrence wins, query order), newest first."""
    seen, items = set(), []
    for query_items in per_query:
        for item in query_items:
            if item["id"] not in seen:
                seen.add(item["id"])
                items.append(item)
    return newest_first(items)


def test_search_merged_matches_corpus_and_per_query(cli, server):
    queries = ["swift", "c", "go"]
    merged = run(cli, "search", "--url", search_url(server), "--results", "/results",
                 "--sort", "/created_at", "--merged", *queries)
    assert merged.returncode == 0, merged.stderr
    items = lines(merged.stdout)
    expected = merge([corpus(server, q) for q in queries])
    assert items == expected
    # swift and c share items: the merge really de-duplicated something.
    assert len(items) < sum(len(corpus(server, q)) for q in queries)
    # The same values as the per-query output, merged here.
    each = run(cli, "search", "--url", search_url(server), "--results", "/results",
               "--sort", "/created_at", *queries)
    assert each.returncode == 0, each.stderr
    by_query = {l["query"]: l["items"] for l in lines(each.stdout)}
    assert merge([by_query[q] for q in queries]) == items


def test_search_merged_deduplicates_by_the_id_pointer(cli, server):
    # --id chooses what counts as the same item: by author, the first item
    # of each author is kept (queries in order, each query's items sorted by
    # --sort), and fewer than by /id.
    queries = ["swift", "c", "go"]
    r = run(cli, "search", "--url", search_url(server), "--results", "/results",
            "--sort", "/created_at", "--id", "/author", "--merged", *queries)
    assert r.returncode == 0, r.stderr
    seen, expected = set(), []
    for q in queries:
        for item in newest_first(corpus(server, q)):
            if item["author"] not in seen:
                seen.add(item["author"])
                expected.append(item)
    assert lines(r.stdout) == newest_first(expected)
    assert len(expected) < len(merge([corpus(server, q) for q in queries]))


def test_search_failure_per_query_and_merged(cli, server):
    r = run(cli, "search", "--url", search_url(server), "--results", "/results",
            "--sort", "/created_at", "swift", "__fail")
    assert r.returncode == 1
    [line] = lines(r.stdout)
    assert line["query"] == "swift" and line["items"] == newest_first(corpus(server, "swift"))
    err = r.stderr.decode()
    assert err.startswith('fetchq: search "__fail": ') and "500" in err
    assert err.count("\n") == 1

    r = run(cli, "search", "--url", search_url(server), "--results", "/results",
            "--sort", "/created_at", "--merged", "swift", "__fail", "rust")
    assert r.returncode == 1
    assert lines(r.stdout) == merge([corpus(server, "swift"), corpus(server, "rust")])
    err = r.stderr.decode()
    assert err.startswith('fetchq: search "__fail": ') and "500" in err


def test_search_bad_results_pointer_fails(cli, server):
    # Without --results the whole document must be the array: it is an object.
    r = run(cli, "search", "--url", search_url(server), "swift")
    assert r.returncode == 1
    assert r.stdout == b""
    assert 'search "swift"' in r.stderr.decode() and "not an array" in r.stderr.decode()


# ---------------------------------------------------------------- get / request


def test_get_several_urls(cli, server):
    urls = [server + "/json?size=100", server + "/status/204", server + "/", server + "/bytes?n=300"]
    r = run(cli, "get", *urls)
    assert r.returncode == 0, r.stderr
    assert r.stderr == b""
    got = {l["url"]: l for l in lines(r.stdout)}
    assert sorted(got) == sorted(urls)
    j = got[urls[0]]
    assert j["method"] == "GET" and j["status"] == 200
    assert j["json"] == get_json(urls[0])
    with urllib.request.urlopen(urls[0], timeout=10) as resp:
        assert j["metrics"]["bytes"] == len(resp.read())
    assert "headers" not in j
    assert got[urls[1]]["status"] == 204 and got[urls[1]]["body"] == ""
    assert got[urls[2]]["json"] == {"server": "fetchq-testserver", "corpus_items": 80}
    # Bytes 0..299 as i % 251 are not all valid UTF-8 text: base64.
    raw = base64.b64decode(got[urls[3]]["body_base64"])
    assert raw == bytes(i % 251 for i in range(300))
    for line in got.values():
        assert set(line) <= {"method", "url", "status", "json", "body", "body_base64", "metrics"}
        assert line["metrics"]["attempts"] == 1


def test_line_and_paragraph_separators_are_escaped_in_result_lines(cli, server):
    # U+2028 and U+2029 are valid unescaped in JSON, but splitlines() (and
    # older JavaScript) breaks a line at them: a result must stay one line.
    url = server + "/echo?s=a%E2%80%A8b%E2%80%A9c%C2%85d"
    r = run(cli, "get", url)
    assert r.returncode == 0, r.stderr
    assert b"\xe2\x80\xa8" not in r.stdout and b"\xe2\x80\xa9" not in r.stdout and b"\xc2\x85" not in r.stdout
    assert b"a\\u2028b\\u2029c\\u0085d" in r.stdout, r.stdout
    got = lines(r.stdout)
    assert len(got) == 1 and got[0]["json"]["query"] == {"s": "a\u2028b\u2029c\x85d"}


def test_reals_are_written_in_their_shortest_form(cli, server):
    # jansson writes 17 significant digits (19.99 as 19.989999999999998);
    # the CLI writes what reads back as the same double, as the server did.
    r = run(cli, "get", server + "/reals")
    assert r.returncode == 0, r.stderr
    assert (b'"json":{"price":19.99,"ratio":0.1,"tiny":1e-07,"big":1.5e+300,'
            b'"sum":0.30000000000000004,"whole":100.0,"neg":-2.5}') in r.stdout, r.stdout
    assert lines(r.stdout)[0]["json"] == get_json(server + "/reals")


def test_get_include_headers_and_request_header(cli, server):
    r = run(cli, "get", "-i", "-H", "X-Probe:  yes ", server + "/echo")
    assert r.returncode == 0, r.stderr
    [line] = lines(r.stdout)
    assert line["headers"]["content-type"] == "application/json"
    assert line["headers"]["server"] == "fetchq-testserver"
    assert line["json"]["headers"]["x-probe"] == "yes"


def test_request_method_header_data(cli, server):
    r = run(cli, "request", "-X", "PUT", "-H", "X-Trace: 42", "--data", "hello", server + "/echo")
    assert r.returncode == 0, r.stderr
    [line] = lines(r.stdout)
    echo = line["json"]
    assert line["method"] == "PUT" and echo["method"] == "PUT"
    assert echo["headers"]["x-trace"] == "42"
    assert echo["body"] == "hello"


def test_request_data_from_file_and_stdin(cli, server, tmp_path):
    text = "héllo\nworld – ünïcode\n"
    f = tmp_path / "body.txt"
    f.write_text(text, encoding="utf-8")
    r = run(cli, "request", "--data", f"@{f}", server + "/echo")
    assert r.returncode == 0, r.stderr
    [line] = lines(r.stdout)
    assert line["method"] == "POST"  # a body makes the default method POST
    assert line["json"]["body"] == text
    assert line["json"]["headers"]["content-length"] == str(len(text.encode()))

    r = run(cli, "request", "-X", "PATCH", "--data", "@-", server + "/echo", input=b"from stdin")
    assert r.returncode == 0, r.stderr
    [line] = lines(r.stdout)
    assert line["json"]["method"] == "PATCH" and line["json"]["body"] == "from stdin"

    binary = tmp_path / "body.bin"
    binary.write_bytes(b"\xff\xfe\x00")
    r = run(cli, "request", "--data", f"@{binary}", server + "/echo")
    assert r.returncode == 2 and b"UTF-8" in r.stderr and r.stdout == b""

    r = run(cli, "request", "--data", f"@{tmp_path / 'missing'}", server + "/echo")
    assert r.returncode == 2 and b"No such file" in r.stderr


def test_request_json_body(cli, server):
    r = run(cli, "request", "--json", '{"name": "fetchq", "n": [1, 2]}', server + "/echo")
    assert r.returncode == 0, r.stderr
    echo = lines(r.stdout)[0]["json"]
    assert echo["method"] == "POST"
    assert echo["headers"]["content-type"] == "application/json"
    assert json.loads(echo["body"]) == {"name": "fetchq", "n": [1, 2]}

    r = run(cli, "request", "--json", "{not json", server + "/echo")
    assert r.returncode == 2 and b"--json" in r.stderr


def test_failing_urls_exit_1(cli, server):
    r = run(cli, "get", server + "/status/404", server + "/json?size=10", "http://127.0.0.1:1/")
    assert r.returncode == 1
    [line] = lines(r.stdout)
    assert line["url"] == server + "/json?size=10"
    err = r.stderr.decode().splitlines()
    assert len(err) == 2
    assert f"fetchq: GET {server}/status/404: HTTP status 404" in err
    assert any(l.startswith("fetchq: GET http://127.0.0.1:1/: ") for l in err)


def test_timeout_option(cli, server):
    start = time.monotonic()
    r = run(cli, "get", "--timeout", "0.3", server + "/delay?ms=5000", timeout=30)
    assert r.returncode == 1
    assert "/delay?ms=5000" in r.stderr.decode()
    assert time.monotonic() - start < 4  # the limit applied; not the 5 s delay


def test_a_timeout_under_half_a_millisecond_is_still_a_limit(cli, server):
    # It used to round to 0 ms, which means no limit: the 5 s delay was waited out.
    start = time.monotonic()
    r = run(cli, "get", "--timeout", "0.0004", server + "/delay?ms=5000", timeout=30)
    assert r.returncode == 1
    assert "timed out" in r.stderr.decode().lower(), r.stderr
    assert time.monotonic() - start < 4


def test_retry_option(cli, server):
    r = run(cli, "get", "--retry", "2", server + "/flaky?key=cli-retry-1&fail=2")
    assert r.returncode == 0, r.stderr
    [line] = lines(r.stdout)
    assert line["json"] == {"attempt": 3}
    assert line["metrics"]["attempts"] == 3

    r = run(cli, "get", server + "/flaky?key=cli-retry-2&fail=1")
    assert r.returncode == 1 and b"503" in r.stderr


def test_concurrency_and_per_host_limits_seen_by_server(cli, server):
    urls = [f"{server}/delay?ms=300&i={i}" for i in range(6)]
    reset(server)
    r = run(cli, "get", "--concurrency", "2", *urls)
    assert r.returncode == 0, r.stderr
    assert len(lines(r.stdout)) == 6
    s = stats(server)
    assert s["requests"] == 6 and s["max_in_flight"] == 2

    reset(server)
    r = run(cli, "get", "--concurrency", "8", "--per-host", "1", *urls[:4])
    assert r.returncode == 0, r.stderr
    s = stats(server)
    assert s["requests"] == 4 and s["max_in_flight"] == 1


def test_priority_option_passed_to_engine(cli, server):
    r = run(cli, "get", "--priority", "very-high", "--concurrency", "1", server + "/")
    assert r.returncode == 0, r.stderr
    r = run(cli, "get", "--priority", "-4", server + "/")
    assert r.returncode == 0, r.stderr
    r = run(cli, "get", "--priority", "3", server + "/")  # not a level: the engine says so
    assert r.returncode == 2 and b"priority" in r.stderr


def test_cache_option_is_passed_through(cli, server):
    # A mode no engine accepts: the engine's error (unknown key "cache", or a
    # bad value), never silently ignored.
    reset(server)
    r = run(cli, "get", "--cache", "no-such-mode", server + "/cache?key=cli-cache")
    assert r.returncode == 2
    assert b"cache" in r.stderr and r.stdout == b""
    # The modes it names are those the CLI takes (only-if-cached is not one).
    assert b'"reload", "stale-while-revalidate"' in r.stderr and b"only-if-cached" not in r.stderr
    assert stats(server)["requests"] == 0
    # A real mode: works if the engine has the option, else its message.
    r = run(cli, "get", "--cache", "reload", server + "/cache?key=cli-cache")
    if r.returncode == 0:
        assert lines(r.stdout)[0]["json"]["key"] == "cli-cache"
    else:
        assert r.returncode == 2 and b'unknown key "cache"' in r.stderr
    # only-if-cached could never answer within one run: a usage error, and
    # nothing is sent.
    r = run(cli, "get", "--cache", "only-if-cached", server + "/cache?key=cli-cache",
            server + "/cache?key=cli-cache")
    assert r.returncode == 2 and b"only-if-cached would never answer" in r.stderr and r.stdout == b""
    assert stats(server)["requests"] == 1


# ---------------------------------------------------------------- usage errors


@pytest.mark.parametrize("args, needle", [
    (["get"], "at least one URL"),
    (["search", "swift"], "--url"),
    (["search", "--url", "http://x/?q={query}"], "at least one query"),
    (["get", "--concurrency", "0", "http://x/"], "--concurrency"),
    (["get", "--timeout", "-1", "http://x/"], "--timeout must be between 0 and 86400 seconds, got -1"),
    (["get", "--concurrency", "-1", "http://x/"], "--concurrency must be at least 1, got -1"),
    (["get", "--retry", "-1", "http://x/"], "options.retry.max: -1 is out of range"),
    (["get", "--bogus", "http://x/"], "--bogus"),
    (["request", "--data", "a", "--json", "1", "http://x/"], "not both"),
    (["get", "-H", "no colon", "http://x/"], "Name: value"),
    (["search", "--order", "up", "--url", "http://x/{query}", "q"], "order"),
    (["frobnicate"], "frobnicate"),
])
def test_usage_errors_exit_2(cli, args, needle):
    r = run(cli, *args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == b""
    assert needle in r.stderr.decode()


def test_requests_refused_at_submit_exit_2_and_passwords_are_not_shown(cli, server):
    r = run(cli, "request", "-X", "HEAD", "--data", "x", server + "/echo")
    assert r.returncode == 2 and b"a HEAD request cannot have a body" in r.stderr, r.stderr
    r = run(cli, "request", "-H", "Content-Length: 2", "--data", "hello", server + "/echo")
    assert r.returncode == 2 and b'header "Content-Length": set by fetchq from the body' in r.stderr, r.stderr
    r = run(cli, "get", "http://bob:pw123@127.0.0.1:1/x")
    assert r.returncode == 1 and b"http://bob:***@127.0.0.1:1/x" in r.stderr and b"pw123" not in r.stderr


def test_proxy_option(cli, server):
    origin = "http://127.0.0.1:1/echo?via=proxy"  # only a proxy can answer it
    r = run(cli, "get", "--proxy", server, origin)
    assert r.returncode == 0, r.stderr
    assert lines(r.stdout)[0]["json"]["query"] == {"via": "proxy"}
    r = subprocess.run([cli, "get", "--proxy", "", origin], capture_output=True, timeout=60,
                       env={**os.environ, "http_proxy": server})
    assert r.returncode == 1 and b"Couldn't connect" in r.stderr, r.stderr


def test_engine_rejections_exit_2_and_send_nothing(cli, server):
    reset(server)
    # The first URL is fine and accepted; the second is refused: nothing runs.
    r = run(cli, "get", server + "/delay?ms=10", "ftp://example.com/x")
    assert r.returncode == 2
    assert r.stderr.decode() == ('fetchq: url "ftp://example.com/x": only absolute http:// and '
                                 "https:// URLs with a host are allowed\n")
    r = run(cli, "get", "--per-host", "0", server + "/")
    assert r.returncode == 2 and b"max_per_host" in r.stderr
    r = run(cli, "search", "--url", server + "/search", "swift")
    assert r.returncode == 2 and b"{query}" in r.stderr
    assert stats(server)["requests"] == 0


def test_help_and_version(cli):
    for sub in [[], ["search"], ["get"], ["request"]]:
        r = run(cli, *sub, "--help")
        assert r.returncode == 0
        out = r.stdout.decode()
        assert "Examples" in out and "fetchq " in out
        if sub:  # --retry names the statuses retried (not every 5xx: 501 and 505 are not)
            assert "5xx" not in out and "500, 502, 503, 504" in " ".join(out.split())
    r = run(cli, "--version")
    header = (ROOT / "include" / "fetchq.h").read_text()
    version = re.search(r'#define FQ_VERSION_STRING "([^"]+)"', header).group(1)
    assert r.returncode == 0 and r.stdout.decode().strip() == version


# ---------------------------------------------------------------- examples


def example_commands(text: str) -> list:
    """Commands of example text: lines starting with `fetchq ` (or a pipe
    into it), joined with their `\\` continuation lines; a trailing
    `# exit N` gives the expected status."""
    commands, current = [], None
    for raw in text.splitlines():
        line = raw.strip()
        if current is not None:
            current += " " + line
        elif line.startswith("fetchq ") or re.match(r"^\S.*\| fetchq ", line) or line == "fetchq":
            current = line
        else:
            continue
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        m = re.search(r"\s+# exit (\d+)$", current)
        commands.append((current[:m.start()] if m else current, int(m.group(1)) if m else 0))
        current = None
    return commands


def run_examples(cli: str, server: str, commands: list) -> None:
    port = server.rsplit(":", 1)[1]
    with tempfile.TemporaryDirectory() as bindir:
        os.symlink(cli, os.path.join(bindir, "fetchq"))
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
        for command, status in commands:
            command = command.replace(f"127.0.0.1:{DOC_PORT}", f"127.0.0.1:{port}")
            # pipefail: an example piped into another program (`| wc -l`)
            # fails when fetchq does.
            r = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, env=env, timeout=60)
            assert r.returncode == status, (command, r.returncode, r.stderr.decode())
            if status == 0:
                assert r.stdout.strip(), command
            else:
                assert r.stderr.startswith(b"fetchq: ") or b"Error:" in r.stderr, (command, r.stderr)


def test_docs_examples_run(cli, server):
    text = DOCS.read_text()
    section = text[text.index("## Examples"):]
    commands = example_commands(section)
    assert len(commands) >= 12
    assert {s for _, s in commands} == {0, 1, 2}
    run_examples(cli, server, commands)


def test_help_examples_run(cli, server):
    commands = []
    for sub in [[], ["search"], ["get"], ["request"]]:
        out = run(cli, *sub, "--help").stdout.decode()
        found = example_commands(out[out.index("Examples"):out.index("USAGE:")])
        assert len(found) >= 3, (sub, out)
        commands += found
    run_examples(cli, server, commands)


# ---------------------------------------------------------------- Ctrl-C


def interrupt_when(cli: str, args: list, ready, what: str):
    proc = subprocess.Popen([cli, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(ready, what)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        return proc.returncode, out, err, time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ctrl_c_cancels_stalled_requests(cli, server):
    reset(server)
    urls = [f"{server}/stall?i={i}" for i in range(4)]
    code, out, err, took = interrupt_when(
        cli, ["get", "--concurrency", "2", *urls],
        lambda: stats(server)["in_flight"] == 2, "two stalled requests in flight")
    assert code == 130, err
    assert out == b""
    assert err == b"fetchq: interrupted\n"
    assert took < 5
    # The queued ones never started; the running ones were aborted.
    assert stats(server)["requests"] == 2
    wait_for(lambda: stats(server)["in_flight"] == 0, "the server to see the connections go")


def test_ctrl_c_keeps_finished_results_and_cancels_a_search(cli, server):
    reset(server)
    code, out, err, _ = interrupt_when(
        cli, ["get", server + "/json?size=10", server + "/stall"],
        lambda: stats(server)["in_flight"] == 1 and stats(server)["requests"] == 2, "the stall")
    assert code == 130
    assert [l["url"] for l in lines(out)] == [server + "/json?size=10"]
    assert err == b"fetchq: interrupted\n"

    reset(server)
    code, out, err, _ = interrupt_when(
        cli, ["search", "--merged", "--url", server + "/stall?q={query}", "a", "b", "c"],
        lambda: stats(server)["in_flight"] == 3, "three stalled searches")
    assert code == 130 and out == b""
    # Says why the queries that had completed printed nothing.
    assert err == (b"fetchq: interrupted; with --merged nothing is printed: "
                   b"the merged list would be incomplete\n")


def test_ctrl_c_while_a_long_merged_list_is_written_stops_and_says_how_much(cli, server):
    # ~160 000 items; stdout is a pipe read only after the interrupt, so the
    # writing blocks part of the way.
    url = server + "/json?size=8000000&q={query}"
    # Unbuffered: communicate() reads the pipe itself, not what a buffered
    # readline() would have taken from it ahead.
    proc = subprocess.Popen([cli, "search", "--merged", "--url", url, "--results", "/items", "a"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    try:
        first = proc.stdout.readline()               # the list is being written
        assert first.startswith(b"{"), first
        time.sleep(0.3)                              # the pipe fills; the writer blocks
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)                              # the watcher has seen it
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    written = 1 + len(lines(rest))
    assert proc.returncode == 130, err
    m = re.fullmatch(rb"fetchq: interrupted; the merged list on stdout was cut short: (\d+) of (\d+) items\n", err)
    assert m, err
    assert int(m.group(1)) == written and written < int(m.group(2)) > 100_000


def test_ctrl_c_during_retry_wait(cli, server):
    reset(server)
    code, out, err, took = interrupt_when(
        cli, ["get", "--retry", "8", server + "/flaky?key=cli-int&fail=100"],
        lambda: stats(server)["by_path"].get("/flaky", 0) >= 2, "two attempts")
    assert code == 130 and out == b"" and err == b"fetchq: interrupted\n"
    assert took < 5


# ---------------------------------------------------------------- review fixes


def test_results_that_cannot_be_written_are_an_error(cli, server):
    # A full disk, and a closed stdout (whose descriptor the engine's own
    # descriptors must not take over): exit 1 with a message, not exit 0.
    with open("/dev/full", "wb") as full:
        r = subprocess.run([cli, "get", server + "/json?size=10", server + "/json?size=20"],
                           stdout=full, stderr=subprocess.PIPE, timeout=60)
    assert r.returncode == 1
    assert r.stderr.decode() == "fetchq: cannot write the results to standard output: No space left on device\n"
    r = subprocess.run(f"exec {cli} get {server}/json?size=10 >&-", shell=True, stderr=subprocess.PIPE, timeout=60)
    assert r.returncode == 1
    assert r.stderr.decode() == "fetchq: cannot write the results to standard output: Bad file descriptor\n"


def test_a_non_blocking_stdout_that_fills_up_is_waited_for(cli, server):
    # A parent may hand out a non-blocking pipe: a full one (EAGAIN) was a
    # write error (exit 1) and a line cut at 64 KiB (the tenth review).
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        proc = subprocess.Popen([cli, "get", server + "/json?size=300000"], stdout=write_end,
                                stderr=subprocess.PIPE)
        os.close(write_end)
        write_end = -1
        time.sleep(1.0)                         # the pipe (64 KiB) is full by now
        out = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            out += chunk
        rc = proc.wait(timeout=60)
        err = proc.stderr.read()
        proc.stderr.close()
    finally:
        if write_end >= 0:
            os.close(write_end)
        os.close(read_end)
    assert rc == 0, err
    (line,) = lines(out)
    assert line["status"] == 200 and len(json.dumps(line["json"])) >= 300000


def test_usage_errors_of_the_command_line_itself(cli, server, tmp_path):
    # `fetchq` alone is a missing argument: exit 2, the usage on stderr
    # (it printed the help on stdout and exited 0: the tenth review).
    r = run(cli)
    assert r.returncode == 2 and r.stdout == b""
    assert b"a subcommand is required" in r.stderr and b"Usage: fetchq <subcommand>" in r.stderr
    assert run(cli, "--help").returncode == 0
    # A closed stdin is an error for `--input -` wherever it comes: after
    # `--input FILE` it read that file's descriptor, at its end (nothing).
    urls = tmp_path / "urls.txt"
    urls.write_text(server + "/json?size=1\n")
    for order in (["--input", str(urls), "--input", "-"], ["--input", "-", "--input", str(urls)]):
        r = subprocess.run([cli, "get", *order], stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                           preexec_fn=lambda: os.close(0))
        assert r.returncode == 2, (order, r.stderr)
        assert b"--input -: standard input is closed" in r.stderr and r.stdout == b""


def test_arguments_that_are_not_utf8_are_refused(cli, server):
    reset(server)
    for args in (["request", "--data", b"caf\xe9", server + "/echo"],
                 ["search", "--url", search_url(server), b"\xff"],
                 ["get", "-H", b"X-A: \xfe", server + "/echo"]):
        r = subprocess.run([cli, *args], capture_output=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert b"is not valid UTF-8" in r.stderr and r.stdout == b""
    assert stats(server)["requests"] == 0


def test_a_repeated_header_name_joins_its_values(cli, server):
    r = run(cli, "get", "-H", "X-A: 1", "-H", "x-a: 2", "-H", "X-A: 3", "-H", "Cookie: a=1", "-H", "cookie: b=2",
            server + "/echo")
    assert r.returncode == 0, r.stderr
    headers = lines(r.stdout)[0]["json"]["headers"]
    assert headers["x-a"] == "1, 2, 3"
    assert headers["cookie"] == "a=1; b=2"


def test_a_json_body_is_sent_as_given(cli, server):
    text = '{"price": 0.1, "n": 1e2,  "a": 1, "a": 2}'
    r = run(cli, "request", "--json", text, server + "/echo")
    assert r.returncode == 0, r.stderr
    echo = lines(r.stdout)[0]["json"]
    assert echo["body"] == text
    assert echo["headers"]["content-type"] == "application/json"
    r = run(cli, "request", "-H", "content-type: application/vnd.x+json", "--json", "[1]", server + "/echo")
    assert lines(r.stdout)[0]["json"]["headers"]["content-type"] == "application/vnd.x+json"
    # Valid JSON that jansson cannot check: refused, and the message says so.
    r = run(cli, "request", "--json", '{"id": 18446744073709551615}', server + "/echo")
    assert r.returncode == 2
    assert b"valid JSON that jansson cannot check" in r.stderr and b"Usage: fetchq request" in r.stderr


def test_repeated_data_parts_are_joined_with_ampersands(cli, server, tmp_path):
    part = tmp_path / "part.txt"
    part.write_text("c=3")
    r = run(cli, "request", "-d", "a=1", "--data", "b=2", "-d", f"@{part}", "-d", "@-", server + "/echo",
            input=b"d=4")
    assert r.returncode == 0, r.stderr
    echo = lines(r.stdout)[0]["json"]
    assert echo["method"] == "POST" and echo["body"] == "a=1&b=2&c=3&d=4"
    r = run(cli, "request", "-d", "@-", "-d", "@-", server + "/echo", input=b"x")
    assert r.returncode == 2 and b"standard input can be read once" in r.stderr


def test_parse_failures_name_the_method_and_what_was_wrong(cli, server, tmp_path):
    r = run(cli, "request", "-X", "PUT", server + "/invalid-utf8")
    assert r.returncode == 1
    assert r.stderr.decode().startswith(f"fetchq: PUT {server}/invalid-utf8: the response is not valid JSON: ")

    import http.server
    class Big(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"id": 18446744073709551615}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Big)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/big"
        r = run(cli, "get", url)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert r.returncode == 1
    assert r.stderr.decode().startswith(f"fetchq: GET {url}: the response is JSON that jansson cannot hold: ")


def test_usage_errors_found_after_parsing_show_the_subcommands_usage(cli, tmp_path):
    for args in (["request", "--json", "{bad", "http://x/"],
                 ["request", "--data", f"@{tmp_path / 'missing'}", "http://x/"],
                 ["get", "--input", str(tmp_path / "missing")]):
        r = run(cli, *args)
        assert r.returncode == 2
        err = r.stderr.decode()
        assert f"Usage: fetchq {args[0]} " in err and f"See 'fetchq {args[0]} --help'" in err, err


def test_an_ignored_sigint_stays_ignored(cli, server):
    # A background job of a shell starts with SIGINT ignored: Ctrl-C in the
    # terminal is not for it.
    reset(server)
    proc = subprocess.Popen([cli, "get", server + "/delay?ms=400"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        wait_for(lambda: stats(server)["in_flight"] == 1, "the request in flight")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert lines(out)[0]["json"] == {"delayed": 400}


def test_no_thread_to_spare_is_an_error_not_a_crash(cli, server):
    # Each thread reserves an 8 MiB stack: raising RLIMIT_AS step by step
    # lets the system refuse, in turn, the engine's threads, the CLI's Ctrl-C
    # watcher and the transport's. The watcher's refusal stopped the process
    # (SIGILL, no message); the engine's was called a usage error (exit 2).
    import resource

    def under(limit_mib):
        limit = limit_mib << 20
        return subprocess.run([cli, "get", "--no-progress", server + "/json?size=10"], capture_output=True,
                              timeout=60, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))

    seen = {}
    for mib in range(24, 400, 2):
        r = under(mib)
        if r.returncode == 127:     # the loader could not map the libraries yet
            continue
        assert r.returncode in (0, 1), (mib, r.returncode, r.stderr)
        if r.returncode == 1:
            assert re.search(rb"cannot start (the engine's thread|the transport).*pthread_create failed", r.stderr), \
                (mib, r.stderr)
            seen.setdefault(b"engine's thread" in r.stderr, mib)
        else:
            assert [l["url"] for l in lines(r.stdout)] == [server + "/json?size=10"], r.stdout
            seen["ok"] = mib
            break
    # the scan crossed the engine's refusal, the transport's and then a run that worked
    assert set(seen) == {True, False, "ok"}, seen
    assert seen[True] < seen[False] < seen["ok"], seen


def test_input_reads_urls_and_queries_from_a_file_or_stdin(cli, server, tmp_path):
    urls = tmp_path / "urls.txt"
    urls.write_bytes(b"".join(f"{server}/json?size={n}\r\n".encode() for n in range(1, 2001)) + b"\n\n")
    r = run(cli, "get", "--concurrency", "32", "--input", str(urls), server + "/json?size=0", timeout=120)
    assert r.returncode == 0, r.stderr
    got = sorted(l["url"] for l in lines(r.stdout))
    assert got == sorted([f"{server}/json?size={n}" for n in range(0, 2001)])

    r = run(cli, "search", "--url", search_url(server), "--results", "/results", "--input", "-",
            input="swift\n\nrust\r\n".encode())
    assert r.returncode == 0, r.stderr
    assert sorted(l["query"] for l in lines(r.stdout)) == ["rust", "swift"]

    r = run(cli, "request", "--input", "-", "--data", "@-", "http://x/")
    assert r.returncode == 2 and b"both read standard input" in r.stderr
    r = run(cli, "request", "--input", "-", "--json", "@-", server + "/echo", input=b"[1]\n")
    assert r.returncode == 2 and b"both read standard input" in r.stderr and r.stdout == b""
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"\n\r\n")
    r = run(cli, "get", "--input", str(empty))
    assert r.returncode == 2 and b"at least one URL" in r.stderr
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"http://x/caf\xe9\n")
    r = run(cli, "get", "--input", str(latin))
    assert r.returncode == 2 and b"not UTF-8" in r.stderr
    # The message quotes the path as given (no "@") and says what --input reads.
    assert f"--input {latin}: not UTF-8 text (--input reads one URL or query per line as text)".encode() in r.stderr
    missing = tmp_path / "missing.txt"
    r = run(cli, "get", "--input", str(missing))
    assert r.returncode == 2 and f"--input {missing}: No such file or directory".encode() in r.stderr


def test_input_is_repeatable_and_drops_a_byte_order_mark(cli, server, tmp_path):
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_bytes(b"\xef\xbb\xbfswift\r\nrust\n")   # saved as "UTF-8 with BOM"
    second.write_bytes(b"\xef\xbb\xbfgo\n")
    r = run(cli, "search", "--url", search_url(server), "--results", "/results",
            "--input", str(first), "--input", str(second))
    assert r.returncode == 0, r.stderr
    assert sorted(l["query"] for l in lines(r.stdout)) == ["go", "rust", "swift"]
    r = run(cli, "get", "--input", "-", "--input", "-", input=b"http://x/\n")
    assert r.returncode == 2 and b"--input - is given twice" in r.stderr


def test_merged_queries_are_distinct_by_their_bytes(cli, server):
    # "\u00e9" and "e\u0301" look alike but are different queries to a server.
    reset(server)
    queries = ["\u00e9", "e\u0301", "\u00e9"]
    r = run(cli, "search", "--url", search_url(server), "--results", "/results", "--merged", *queries)
    assert r.returncode == 0, r.stderr
    assert stats(server)["requests"] == 2


# ---------------------------------------------------------------- progress bar


def test_no_progress_when_stderr_is_not_a_tty(cli, server):
    r = run(cli, "get", server + "/json?size=20000", server + "/delay?ms=300")
    assert r.returncode == 0
    assert r.stderr == b""


def run_with_pty_stderr(cli: str, args: list, env: dict | None = None) -> tuple:
    master, slave = pty.openpty()
    proc = subprocess.Popen([cli, *args], stdout=subprocess.PIPE, stderr=slave,
                            env=None if env is None else dict(os.environ, **env))
    os.close(slave)
    chunks = []

    def reader():
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO once the child closed the pty
                break
            if not data:
                break
            chunks.append(data)

    t = threading.Thread(target=reader)
    t.start()
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        t.join(timeout=10)
        os.close(master)
    return proc.returncode, out, b"".join(chunks).decode()


def test_log_lines_do_not_land_on_the_bar(cli, server):
    # The engine's log lines (FETCHQ_LOG) go through the CLI's console: the
    # bar is cleared before one ("\r\x1b[K"), as for an error message. The
    # engine wrote them itself, right after the bar's text on its line (the
    # tenth review).
    reset(server)
    urls = [server + "/flaky?key=cli-log-bar&fail=1&ms=400", server + "/delay?ms=1200"]
    code, out, err = run_with_pty_stderr(cli, ["get", "--retry", "1", *urls], env={"FETCHQ_LOG": "info"})
    assert code == 0, err
    at = [m.start() for m in re.finditer("fetchq info: retrying", err)]
    assert len(at) == 1, err
    assert "\r" in err[:at[0]], "no bar was drawn before the retry: %r" % err[:at[0]]
    assert err[:at[0]].endswith("\r\x1b[K") or err[:at[0]].endswith("\n"), repr(err[max(0, at[0] - 80):at[0] + 40])


def size(n: int) -> str:
    """The CLI's byte format: 512 B, 12.3 KiB, 4.0 MiB."""
    if n < 1024:
        return f"{n} B"
    value = n / 1024
    for unit in ["KiB", "MiB", "GiB"]:
        if value < 1024 or unit == "GiB":
            tenths = int(value * 10 + 0.5)
            return f"{tenths // 10}.{tenths % 10} {unit}"
        value /= 1024


def test_progress_bar_under_a_pty(cli, server):
    urls = [server + "/drip?bytes=3000&chunk=300&interval_ms=100", server + "/json?size=50000",
            server + "/delay?ms=400"]
    code, out, err = run_with_pty_stderr(cli, ["get", *urls])
    assert code == 0, err
    results = lines(out)
    assert len(results) == 3
    assert "\r" in err
    frames = [f for f in re.split(r"[\r\n]+", err) if f.strip()]
    assert len(frames) >= 3  # redrawn while the drip ran (~1 s at ≤ 10/s)
    final = frames[-1].replace("\x1b[K", "")
    total = sum(r["metrics"]["bytes"] for r in results)
    assert total > 50000
    assert re.fullmatch(r"\[#{20}\]  3/3 ops  " + re.escape(size(total)) + r"  \S+ \S*B/s", final), final
    assert err.endswith("\n")
    # Counts only go up.
    done = [int(m.group(1)) for m in re.finditer(r"(\d+)/3 ops", err)]
    assert done == sorted(done) and done[-1] == 3


def test_progress_bar_counts_failures_and_queries(cli, server):
    code, out, err = run_with_pty_stderr(
        cli, ["search", "--merged", "--results", "/results", "--url", search_url(server), "swift", "__fail", "go"])
    assert code == 1
    assert "3/3 ops" in err and "1 failed" in err
    assert 'fetchq: search "__fail": ' in err


def test_no_progress_flag_under_a_pty(cli, server):
    code, out, err = run_with_pty_stderr(cli, ["get", "--no-progress", server + "/json?size=100"])
    assert code == 0
    assert err == "" and len(lines(out)) == 1
