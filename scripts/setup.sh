#!/usr/bin/env bash
# Shared by scripts/demo and scripts/test: installs missing Debian packages, then configures
# and builds asyncckpt into $BUILD_DIR (default: build/). Idempotent; fast when nothing changed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
PACKAGES=(build-essential cmake ninja-build pkg-config git libtbb-dev liburing-dev libzstd-dev
          xtensor-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev)
# The Python package (python/), its tests, the PyTorch example and its benchmark, all for Debian's
# /usr/bin/python3 (CMake picks that interpreter; see cmake/AsyncckptPython.cmake).
PACKAGES+=(python3-dev pybind11-dev python3-numpy python3-torch python3-sklearn python3-pytest)
# Installing it as Python packages are (pyproject.toml; the pip install and wheel test).
PACKAGES+=(python3-setuptools python3-wheel python3-pip python3-venv python3-build)
# The fuzz targets (fuzz/, scripts/fuzz): clang and its libFuzzer runtime.
PACKAGES+=(clang-14 libclang-rt-14-dev)
# Multi-process checkpoints (ASYNCCKPT_MPI, the asyncckpt_mpi library and its mpirun tests).
PACKAGES+=(libopenmpi-dev openmpi-bin)

install_missing_packages() {
  local missing=()
  for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
      missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "asyncckpt setup: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Configures $BUILD_DIR (build type $BUILD_TYPE, default RelWithDebInfo; extra arguments go to
# cmake) with warnings as errors, which the project's own builds always use, and builds it.
configure_and_build() {
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" \
      -DASYNCCKPT_WERROR=ON "$@"
  elif ! grep -qx 'ASYNCCKPT_WERROR:BOOL=ON' "$BUILD_DIR/CMakeCache.txt"; then
    cmake -B "$BUILD_DIR" -DASYNCCKPT_WERROR=ON >/dev/null
  fi
  cmake --build "$BUILD_DIR" -j"$(nproc)"
}
