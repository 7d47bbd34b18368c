#!/usr/bin/env bash
# Shared by scripts/demo, scripts/test and the other scripts: installs the Debian packages that
# are missing, creates or refreshes the project's Python environment .venv/ from
# requirements.txt, then configures and builds asyncckpt into $BUILD_DIR (default: build/).
# Idempotent; fast when nothing changed. Works on Debian 12 and 13 (/etc/debian_version): where
# the two differ (clang's version, Python's), it installs Debian's default of each and never
# names a version.
#
# CMake: the `cmake` first on PATH, Debian's 3.25+ or a 4.x installed from Python's package
# index; the project and the Debian packages' config files work with both.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
VENV="$ROOT/.venv"
VENV_PYTHON="$VENV/bin/python"
REQUIREMENTS="$ROOT/requirements.txt"

PACKAGES=(build-essential cmake ninja-build pkg-config git libtbb-dev liburing-dev libzstd-dev
          xtensor-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev)
# The fuzz targets (fuzz/, scripts/fuzz): Debian's default clang and its libFuzzer runtime
# (14 on Debian 12, 19 on Debian 13).
PACKAGES+=(clang libclang-rt-dev)
# Multi-process checkpoints (ASYNCCKPT_MPI, the asyncckpt_mpi library and its mpirun tests).
PACKAGES+=(libopenmpi-dev openmpi-bin)
# The benchmarks' limits (scripts/bench): fio, and GNU time for peak memory.
PACKAGES+=(fio time)

# The interpreter .venv/ is made from: $ASYNCCKPT_PYTHON, else a python3.11 on PATH (the version
# requirements.txt's torch wheel is built for), else the python3 first on PATH.
venv_base_python() {
  if [ -n "${ASYNCCKPT_PYTHON:-}" ]; then
    echo "$ASYNCCKPT_PYTHON"
  else
    command -v python3.11 || command -v python3
  fi
}

# Debian's python3-dev and python3-venv, when the interpreter .venv/ is made from is Debian's own
# (a python3 built elsewhere, pyenv's say, brings its headers and venv with it).
python_packages_for() {
  local python=$1
  "$python" - <<'PY' 2>/dev/null || echo "python3-dev python3-venv"
import os, sys, sysconfig
ok = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
try:
    import ensurepip, venv  # noqa: F401
except ImportError:
    ok = False
sys.exit(0 if ok else 1)
PY
}

install_missing_packages() {
  local packages=("${PACKAGES[@]}")
  local python
  python=$(venv_base_python) || true
  [ -n "$python" ] && read -r -a extra <<<"$(python_packages_for "$python")" &&
    packages+=("${extra[@]}")
  local missing=()
  for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
      missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "asyncckpt setup: installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}"
  fi
  ensure_venv
}

# What .venv/ was made from: the requirements' checksum and the base interpreter's version. A
# change to either rebuilds the environment.
venv_fingerprint() {
  local python=$1
  echo "$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1) $("$python" -c 'import sys; print(sys.version.split()[0])')"
}

# Creates .venv/ and installs requirements.txt into it, unless it already holds exactly that.
ensure_venv() {
  local python stamp="$VENV/.asyncckpt-requirements"
  python=$(venv_base_python) || {
    echo "asyncckpt setup: no python3 on PATH to make .venv/ from" >&2
    return 1
  }
  local want
  want=$(venv_fingerprint "$python")
  if [ -x "$VENV_PYTHON" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  echo "asyncckpt setup: creating .venv/ with $python and installing requirements.txt"
  local started=$SECONDS
  rm -rf "$VENV"
  "$python" -m venv "$VENV"
  "$VENV_PYTHON" -m pip install -q --disable-pip-version-check -r "$REQUIREMENTS"
  echo "$want" >"$stamp"
  echo "asyncckpt setup: .venv/ ready in $((SECONDS - started)) s"
}

# Configures $BUILD_DIR (build type $BUILD_TYPE, default RelWithDebInfo; extra arguments go to
# cmake) with warnings as errors, which the project's own builds always use, and with the Python
# module built for .venv/'s interpreter; then builds it.
configure_and_build() {
  local python_args=()
  if [ -x "$VENV_PYTHON" ]; then
    python_args=(-DPython3_EXECUTABLE="$VENV_PYTHON")
  fi
  local cache="$BUILD_DIR/CMakeCache.txt"
  if [ ! -f "$cache" ]; then
    cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" \
      -DASYNCCKPT_WERROR=ON "${python_args[@]}" "$@"
  elif ! grep -qx 'ASYNCCKPT_WERROR:BOOL=ON' "$cache" ||
       { [ ${#python_args[@]} -gt 0 ] && ! grep -qx "Python3_EXECUTABLE:FILEPATH=$VENV_PYTHON" "$cache"; }; then
    cmake -B "$BUILD_DIR" -DASYNCCKPT_WERROR=ON "${python_args[@]}" >/dev/null
  fi
  cmake --build "$BUILD_DIR" -j"$(nproc)"
}
