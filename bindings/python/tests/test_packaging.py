"""The binding as pip builds it: a wheel that carries libfetchq.so.0 is
tagged for this platform (a review found py3-none-any, which pip would
install on any architecture), one without it stays pure."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import fetchq

PACKAGE = Path(fetchq.__file__).resolve().parent.parent


def build_wheel(tmp_path: Path, with_library: bool) -> Path:
    src = tmp_path / "src"
    shutil.copytree(PACKAGE, src, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__",
                                                                 "libfetchq.so*"))
    if with_library:
        shutil.copy(fetchq.library_path(), src / "fetchq" / "libfetchq.so.0")
    out = tmp_path / "out"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                   check=True, capture_output=True, timeout=300)
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_a_wheel_with_the_library_is_tagged_for_this_platform(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, with_library=True)
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert wheel.name == "fetchq-%s-py3-none-%s.whl" % (fetchq.__version__, platform)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read("fetchq-%s.dist-info/WHEEL" % fetchq.__version__).decode()
    assert "fetchq/libfetchq.so.0" in names and "fetchq/py.typed" in names
    assert "Root-Is-Purelib: false" in meta


def test_a_wheel_without_the_library_is_pure(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, with_library=False)
    assert wheel.name == "fetchq-%s-py3-none-any.whl" % fetchq.__version__
