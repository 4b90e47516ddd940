"""Library loading, the declaration table, status mapping and the jansson bridge."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from typing import Any

import pytest

import fetchq
from fetchq import _ffi, errors

from conftest import BINDING, REPO, TIMEOUT, expected_library


def test_loads_the_library_named_by_FETCHQ_LIBRARY() -> None:
    want = expected_library()
    if want is None:
        pytest.fail("FETCHQ_LIBRARY must name the library under test (make test-python sets it)")
    assert os.path.realpath(fetchq.library_path()) == want


def test_version_matches_header() -> None:
    header = (REPO / "include" / "fetchq.h").read_text()
    parts = [int(re.search(r"#define FQ_VERSION_%s (\d+)" % k, header).group(1))  # type: ignore[union-attr]
             for k in ("MAJOR", "MINOR", "PATCH")]
    assert fetchq.version() == "%d.%d.%d" % tuple(parts)
    assert _ffi.lib().fq_version() == (parts[0] << 16) | (parts[1] << 8) | parts[2]


def test_declaration_table_covers_every_header_function() -> None:
    header = (REPO / "include" / "fetchq.h").read_text()
    # functions are "name(", callback typedefs "(*name)(" (not matched)
    declared = set(re.findall(r"(?<!\(\*)\b(fq_[a-z_]+)\s*\(", header))
    table = {name for name, *_ in _ffi.FUNCTIONS}
    assert declared == table


def test_missing_function_raises_unsupported() -> None:
    stub = _ffi._Missing("fq_nothing", "/x/libfetchq.so")
    with pytest.raises(fetchq.UnsupportedError, match="fq_nothing is not exported by /x/libfetchq.so"):
        stub()


def test_not_found_lists_every_path_tried(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bogus = tmp_path / "libfetchq.so.0"
    bogus.write_bytes(b"not an ELF file")
    cands = _ffi.candidate_paths(str(tmp_path / "missing.so"), str(tmp_path), system=False)
    assert cands == [str(tmp_path / "missing.so"), str(bogus)]
    with pytest.raises(fetchq.LibraryNotFound) as info:
        _ffi.load_library(cands + ["libdoesnotexist-fetchq.so.9"])
    text = str(info.value)
    for c in cands + ["libdoesnotexist-fetchq.so.9"]:
        assert c in text
    assert "FETCHQ_LIBRARY" in text


def copy_package_sources(pkg: Any) -> None:
    for src in (BINDING / "fetchq").glob("*.py"):
        (pkg / src.name).write_bytes(src.read_bytes())


def test_package_copy_is_found_without_env(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A copy inside the package directory is the second choice."""
    src = fetchq.library_path()
    pkg = tmp_path / "fetchq"
    pkg.mkdir()
    copy_package_sources(pkg)
    os.symlink(src, pkg / "libfetchq.so.0")
    env = dict(os.environ)
    env.pop("FETCHQ_LIBRARY", None)
    env["PYTHONPATH"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", "import fetchq; print(fetchq.library_path())"],
                         env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == os.path.realpath(str(pkg / "libfetchq.so.0"))


def test_error_when_nothing_loads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pkg = tmp_path / "fetchq"
    pkg.mkdir()
    copy_package_sources(pkg)
    env = dict(os.environ)
    env["FETCHQ_LIBRARY"] = str(tmp_path / "nope.so")
    env["PYTHONPATH"] = str(tmp_path)
    env.pop("LD_LIBRARY_PATH", None)
    code = "import fetchq\ntry:\n fetchq.Engine()\nexcept fetchq.LibraryNotFound as e:\n print(e)\n"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    assert str(tmp_path / "nope.so") in out.stdout
    assert "libfetchq.so.0" in out.stdout


def test_every_header_status_has_its_class() -> None:
    header = (REPO / "include" / "fetchq.h").read_text()
    enum = header[header.index("typedef enum fq_status"):header.index("} fq_status;")]
    codes = {int(v) for v in re.findall(r"FQ_ERR_\w+\s*=\s*(-\d+)", enum)}
    assert codes == set(errors._BY_CODE)
    assert len({cls for cls in errors._BY_CODE.values()}) == len(codes)


def test_status_classes_map_one_to_one() -> None:
    L = _ffi.lib()
    seen = set()
    for code in range(-1, -18, -1):
        exc = errors.error_for_status(code, "m")
        assert exc.code == code and exc.message == "m"
        assert type(exc) is not errors.FetchqError
        seen.add(type(exc))
        # the library knows every code we map
        assert L.fq_strerror(code) and L.fq_strerror(code) != L.fq_strerror(-999)
    assert len(seen) == 17
    assert type(errors.error_for_status(-999, "x")) is errors.FetchqError
    assert isinstance(errors.error_for_status(-10), fetchq.Timeout)  # QueueTimeout is a Timeout
    http = errors.error_for_status(-11, "h", status=503, body=b"x")
    assert isinstance(http, fetchq.HTTPError) and http.status == 503 and http.body == b"x"


def test_jansson_is_the_one_libfetchq_links() -> None:
    L = _ffi.lib()
    via_fetchq = ctypes.cast(L.jansson.json_loadb, ctypes.c_void_p).value
    system = ctypes.cast(ctypes.CDLL("libjansson.so.4").json_loadb, ctypes.c_void_p).value
    assert via_fetchq == system


@pytest.mark.parametrize("value", [
    None, True, False, 0, -1, 2**63 - 1, -(2**63), 1.5, -0.25, 1e300, "",
    "ü€𝄞", "a\u0000b", [], {}, [1, [2, [3, {"k": None}]]],
    {"nested": {"list": [1, 2.5, "x"], "t": True}, "ключ": "значение"},
])
def test_json_round_trip(value) -> None:  # type: ignore[no-untyped-def]
    ptr = _ffi.to_json(value)
    try:
        assert _ffi.from_json(ptr) == value
    finally:
        _ffi.decref(ptr)


@pytest.mark.parametrize("value,exc", [
    (float("nan"), ValueError), (float("inf"), ValueError), (2**64, ValueError),
    ("\ud800", ValueError), ({1, 2}, TypeError), (object(), TypeError),
])
def test_json_rejects(value, exc) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(exc):
        _ffi.to_json(value)


def test_decref_is_a_real_decref() -> None:
    """decref() of a shared value only drops one reference."""
    j = _ffi.lib().jansson
    child = _ffi.to_json({"k": "v"})
    a = j.json_array()
    assert j.json_array_append_new(a, child) == 0          # a owns child
    b = j.json_array()
    assert j.json_array_extend(b, a) == 0                  # b shares child
    assert child.contents.refcount == 2
    _ffi.decref(a)                                         # frees a only
    assert child.contents.refcount == 1
    assert _ffi.from_json(b) == [{"k": "v"}]
    _ffi.decref(b)
    _ffi.decref(_ffi.to_json(None))                        # immortal singleton: no-op
    assert _ffi.from_json(_ffi.to_json(True)) is True


def test_an_unknown_status_keeps_its_code() -> None:
    """FetchqError for a status this binding has no class of (a newer
    library's): ``.code`` is still that status, not the base class's 0."""
    exc = errors.error_for_status(-999, "new")
    assert type(exc) is errors.FetchqError and exc.code == -999 and exc.message == "new"
