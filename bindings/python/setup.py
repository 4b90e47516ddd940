"""Only what pyproject.toml cannot say: a wheel that carries libfetchq.so.0
(an ELF for the machine that built it) is tagged for that platform
(py3-none-linux_x86_64, say), not py3-none-any, so that pip does not install
it on another architecture or system."""

import os

from setuptools import setup
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools before 70.1
    from wheel.bdist_wheel import bdist_wheel  # type: ignore[no-redef]

CARRIES_LIBRARY = os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fetchq", "libfetchq.so.0"))


class PlatformWheel(bdist_wheel):  # type: ignore[misc]
    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = not CARRIES_LIBRARY

    def get_tag(self) -> tuple:
        python, abi, platform = super().get_tag()
        return ("py3", "none", platform) if CARRIES_LIBRARY else (python, abi, platform)


class LibraryDistribution(Distribution):
    def has_ext_modules(self) -> bool:  # the library goes in platlib, at the wheel's root
        return CARRIES_LIBRARY


setup(cmdclass={"bdist_wheel": PlatformWheel}, distclass=LibraryDistribution)
