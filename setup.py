"""setuptools build of the asyncckpt Python package: build_ext runs the project's CMake.

pyproject.toml holds the metadata; this file adds what setuptools cannot say there:

- the version, read from CMakeLists.txt's project(VERSION ...) (CMake writes the same number
  into asyncckpt/_version.py, so the two cannot drift);
- build_ext, which configures the project in Release with the module's RPATH set to $ORIGIN,
  builds only the module target (asyncckpt_python), strips it, and copies it into the package
  together with the shared libraries it loads that are not the system's (oneTBB, liburing,
  zstd, xxhash; cudart in a CUDA build), as auditwheel would.

Environment: ASYNCCKPT_CMAKE_BUILD_DIR keeps the CMake build tree there between builds (else
it is setuptools' temporary one); ASYNCCKPT_CMAKE_ARGS adds configure arguments
(e.g. "-DASYNCCKPT_CUDA=OFF"); ASYNCCKPT_BUILD_JOBS sets the parallel jobs; CMake itself reads
CMAKE_CXX_COMPILER_LAUNCHER (ccache).
"""

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent

# Sonames of the libraries that go into the wheel beside the module: everything else the module
# loads (libc, libstdc++, libgcc_s, libm, the dynamic loader) is part of every Linux system.
BUNDLED = re.compile(r"^lib(tbb|uring|zstd|xxhash|cudart)[.\-]")


def cmake_version():
    """The version of project(asyncckpt VERSION x.y.z) in CMakeLists.txt."""
    text = (ROOT / "CMakeLists.txt").read_text()
    found = re.search(r"project\(\s*asyncckpt\s+VERSION\s+([0-9][0-9.]*)", text)
    if not found:
        raise RuntimeError("CMakeLists.txt has no project(asyncckpt VERSION ...)")
    return found.group(1)


def loaded_libraries(module):
    """{soname: path} of the shared libraries `module` loads, as ldd resolves them."""
    out = subprocess.run(["ldd", str(module)], check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/"):
            found[parts[0]] = parts[2]
    return found


class CMakeExtension(Extension):
    """The pybind11 module, built by CMake rather than by setuptools."""

    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures and builds the module with CMake, then places it and its libraries."""

    def build_extension(self, ext):
        build_dir = pathlib.Path(os.environ.get("ASYNCCKPT_CMAKE_BUILD_DIR")
                                 or pathlib.Path(self.build_temp).resolve() / "cmake")
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
            "-DASYNCCKPT_PYTHON=ON", "-DASYNCCKPT_PYTHON_WHEEL=ON",
            "-DASYNCCKPT_BUILD_TESTS=OFF", "-DASYNCCKPT_BUILD_BENCHMARKS=OFF",
            f"-DPython3_EXECUTABLE={sys.executable}",
            *shlex.split(os.environ.get("ASYNCCKPT_CMAKE_ARGS", "")),
        ]
        if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
            configure += ["-G", "Ninja"]
        jobs = os.environ.get("ASYNCCKPT_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "asyncckpt_python",
                        "-j", jobs], check=True)
        package = build_dir / "python" / "asyncckpt"
        built = next(package.glob("_core*.so"))
        destination = pathlib.Path(self.get_ext_fullpath(ext.name))
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, destination)
        subprocess.run(["strip", "--strip-unneeded", str(destination)], check=True)
        shutil.copyfile(package / "_version.py", destination.parent / "_version.py")
        for soname, path in sorted(loaded_libraries(built).items()):
            if BUNDLED.match(soname):
                # The file under the name the module asks for; found through RPATH $ORIGIN.
                shutil.copyfile(os.path.realpath(path), destination.parent / soname)


setup(
    version=cmake_version(),
    ext_modules=[CMakeExtension("asyncckpt._core")],
    cmdclass={"build_ext": CMakeBuild},
    # Not "build/": that is where the project's own CMake build tree usually lives.
    options={"build": {"build_base": "build/setuptools"}},
)
