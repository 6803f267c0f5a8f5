"""Build hooks: the gRPC stubs are generated (generate.py) before the
package's modules are collected, for a wheel, an sdist or an editable
install alike, so `pip install ./clients/python` needs no step before it.
Everything else is declared in pyproject.toml."""

import pathlib
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = pathlib.Path(__file__).resolve().parent


def generate() -> None:
    subprocess.run([sys.executable, str(HERE / "generate.py")], check=True)


class BuildPyWithStubs(build_py):
    def run(self):
        generate()
        super().run()


class SdistWithStubs(sdist):
    def run(self):
        generate()
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithStubs})
