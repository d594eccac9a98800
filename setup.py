"""setup.py — build step of the fusedloss Python package (metadata lives in pyproject.toml).

`pip install .` runs `make -j2 lib` at the repository root (build/libfusedloss.so; the Makefile
adds the CUDA objects when nvcc is found, so a machine without nvcc gets a CPU-only library whose
CUDA entry points return FL_ERR_NOT_BUILT) and copies the library into the installed package,
where fusedloss._lib finds it with no environment variable.

Environment: FUSEDLOSS_MAKE_ARGS adds arguments to make (e.g. "NO_CUDA=1" or "GPU_ARCH=80").
On a machine without network access use `pip install --no-build-isolation .` (setuptools and
wheel must then be installed already).
The wheel is tagged py3-none-<platform>: the library is loaded with ctypes, so it does not
depend on the Python ABI, only on the platform.
"""
import os
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

ROOT = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join(ROOT, "build", "libfusedloss.so")
SETUPTOOLS_BUILD = os.path.join("build", "python")  # keep setuptools' files apart from make's


class BuildPyWithLibrary(build_py):
    """build_py + `make lib`, then libfusedloss.so copied into the package."""

    def run(self):
        super().run()
        cmd = ["make", "-j2", "lib"] + shlex.split(os.environ.get("FUSEDLOSS_MAKE_ARGS", ""))
        print("fusedloss: " + " ".join(cmd), flush=True)
        subprocess.check_call(cmd, cwd=ROOT)
        dest = os.path.join(self.build_lib, "fusedloss")
        os.makedirs(dest, exist_ok=True)
        shutil.copy2(LIB, os.path.join(dest, "libfusedloss.so"))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [
            os.path.join(self.build_lib, "fusedloss", "libfusedloss.so")]


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # a platform wheel: it carries a shared library
        return True


class PlatformWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


os.makedirs(os.path.join(ROOT, SETUPTOOLS_BUILD), exist_ok=True)
setup(
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel},
    options={
        "build": {"build_base": SETUPTOOLS_BUILD},
        "egg_info": {"egg_base": SETUPTOOLS_BUILD},
        "bdist_wheel": {"bdist_dir": os.path.join(SETUPTOOLS_BUILD, "bdist")},
    },
)
