#!/usr/bin/env bash
# One-command set-up of everything the project needs on a Debian 12 machine:
#   1. Debian packages (Open MPI, tmux, SSH, a C++ toolchain and CMake for Horovod);
#   2. a virtual environment in .venv with the exact stack from requirements.txt;
#   3. Horovod compiled against that TensorFlow with MPI support, from its source distribution
#      with scripts/horovod-cycles.patch applied, the wheel cached outside the clone (keyed by
#      every version that affects the binary, and the patch) so later set-ups skip the compile;
#   4. a check that Horovod really has TensorFlow and MPI support, failing loudly if not.
# Idempotent and quick when already done: the Makefile only calls it when requirements.txt, this
# script or the Horovod patch changed, or .venv is missing.
#
# Environment:
#   PYTHON            interpreter for the venv (default: python3; must be 3.9-3.12 for TF 2.18)
#   IMPALA_CACHE_DIR  where built Horovod wheels are kept (default: ~/.cache/impala-horovod)
#   TF_PACKAGE        the TensorFlow distribution (default: tensorflow-cpu; on GPU hosts
#                     "tensorflow[and-cuda]"); the version always comes from requirements.txt
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
REQUIREMENTS=$ROOT/requirements.txt
VENV=$ROOT/.venv
PY=$VENV/bin/python
PYTHON=${PYTHON:-python3}
CACHE_DIR=${IMPALA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/impala-horovod}
TF_PACKAGE=${TF_PACKAGE:-tensorflow-cpu}
# libnss-wrapper: the Docker image's entry point names a uid the image does not know with it.
# iproute2: `ip` and `tc`, with which benchmarks/scaling.py (and its test) shape a link.
# patch: applies scripts/horovod-cycles.patch to Horovod's source before it is compiled.
APT_PACKAGES=(build-essential cmake openmpi-bin libopenmpi-dev tmux openssh-client openssh-server
              procps libnss-wrapper iproute2 patch)
HOROVOD_PATCH=$ROOT/scripts/horovod-cycles.patch

say() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

pip_quietly() {  # pip_quietly ARGS...: pip with its output in a log, shown only if it fails
  local log=$VENV/pip.log
  if ! "$PY" -m pip --disable-pip-version-check "$@" >"$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" | tail -n 30 >&2
    die "pip $* failed; full log: $log"
  fi
}

pin_of() {  # pin_of NAME -> the exact version requirements.txt pins for NAME
  local v
  v=$(sed -n "s/^$1==\([^[:space:]#]*\).*/\1/p" "$REQUIREMENTS")
  [[ -n $v ]] || die "requirements.txt has no exact pin for $1"
  printf '%s' "$v"
}

install_debian_packages() {
  local missing=() p
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return
  local sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || die "missing Debian packages (${missing[*]}) and no sudo: install them as root"
    sudo=(sudo)
  fi
  say "installing Debian packages: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

create_venv() {
  if [[ -x $PY ]] && "$PY" -c 'import sys' 2>/dev/null; then return; fi
  command -v "$PYTHON" >/dev/null || die "no '$PYTHON' on PATH (set PYTHON=/path/to/python3.11)"
  "$PYTHON" - <<'PYCHECK' || die "$PYTHON is not Python 3.9-3.12, which TensorFlow 2.18 needs (set PYTHON=...)"
import sys
sys.exit(0 if (3, 9) <= sys.version_info[:2] <= (3, 12) else 1)
PYCHECK
  say "creating $VENV with $("$PYTHON" --version)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
}

install_python_packages() {
  say "installing the pinned stack from requirements.txt"
  pip_quietly install "pip==$(pin_of pip)"
  # Horovod is built in a second step, against the TensorFlow installed here.
  local reqs
  reqs=$(mktemp)
  grep -v -E '^(horovod|tensorflow-cpu)==' "$REQUIREMENTS" >"$reqs"
  echo "$TF_PACKAGE==$(pin_of tensorflow-cpu)" >>"$reqs"
  pip_quietly install -r "$reqs"
  rm -f "$reqs"
}

horovod_wheel() {  # builds (or finds) the cached Horovod wheel and prints its path
  local hvd tf pytag mpi patched key dir
  hvd=$(pin_of horovod)
  tf=$(pin_of tensorflow-cpu)
  pytag=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  mpi=$(mpirun --version 2>/dev/null | head -n1 | grep -oE '[0-9]+(\.[0-9]+)+' | head -n1)
  [[ -n $mpi ]] || die "mpirun not found or unreadable: Open MPI (openmpi-bin) is required"
  patched=$(sha256sum "$HOROVOD_PATCH" | cut -c1-12)
  key="horovod-$hvd-tf$tf-$TF_PACKAGE-$pytag-$(uname -m)-openmpi$mpi-patch$patched"
  key=${key//[^A-Za-z0-9._-]/_}
  dir=$CACHE_DIR/$key
  if ! compgen -G "$dir/horovod-*.whl" >/dev/null; then
    say "building Horovod $hvd against TensorFlow $tf with MPI (takes ~5 minutes on 2 cores)"
    mkdir -p "$CACHE_DIR"
    local tmp log src
    tmp=$(mktemp -d "$CACHE_DIR/.build.XXXXXX")
    # An interrupted or failed build leaves nothing behind (this runs in $(...)'s subshell).
    trap 'rm -rf "$tmp"' EXIT
    log=$CACHE_DIR/$key.build.log
    # The source distribution, patched (the patch file says what it changes and why); its
    # metadata is read with the venv's setuptools, as the build below uses.
    if ! "$PY" -m pip download --disable-pip-version-check --no-deps --no-binary horovod \
        --no-build-isolation --no-cache-dir -d "$tmp/sdist" "horovod==$hvd" >"$log" 2>&1; then
      tail -n 30 "$log" >&2
      die "could not download Horovod $hvd's source; full log: $log"
    fi
    tar -xzf "$tmp"/sdist/horovod-"$hvd".tar.gz -C "$tmp" >>"$log" 2>&1 ||
      die "could not unpack Horovod $hvd's source ($tmp/sdist); full log: $log"
    src=$tmp/horovod-$hvd
    patch -p1 --forward --silent -d "$src" <"$HOROVOD_PATCH" >>"$log" 2>&1 ||
      die "scripts/horovod-cycles.patch does not apply to Horovod $hvd; full log: $log"
    # CMAKE_POLICY_VERSION_MINIMUM lets a CMake 4 build Horovod's bundled gloo (harmless on 3.25).
    if ! HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
        HOROVOD_WITHOUT_MXNET=1 CMAKE_POLICY_VERSION_MINIMUM=3.5 \
        MAKEFLAGS="-j$(nproc)" \
        "$PY" -m pip wheel --disable-pip-version-check --no-build-isolation --no-deps \
        --no-cache-dir -w "$tmp" "$src" >>"$log" 2>&1; then
      grep -v "^WARNING: Location" "$log" | tail -n 30 >&2
      die "Horovod build failed; full log: $log"
    fi
    rm -rf "$tmp/sdist" "$src"
    # Move into place only when complete, so an interrupted build never looks cached.
    rm -rf "$dir"
    mv "$tmp" "$dir"
    trap - EXIT
  fi
  compgen -G "$dir/horovod-*.whl" | head -n1
}

install_horovod() {  # the cached wheel of this stack and patch, unless .venv already has it
  local wheel built=$VENV/.horovod-wheel
  wheel=$(horovod_wheel)
  if [[ -f $built && $(<"$built") == "$wheel" ]] && check_horovod quiet; then return; fi
  say "installing $(basename "$(dirname "$wheel")")"
  pip_quietly install --no-deps --force-reinstall "$wheel"
  printf '%s' "$wheel" >"$built"
}

check_horovod() {  # fails, naming the missing piece, unless Horovod has TensorFlow and MPI
  local out
  out=$("$PY" - 2>&1 <<'PYCHECK'
# Importing horovod.tensorflow loads the compiled TensorFlow ops: it fails if they were not built.
import horovod
import horovod.tensorflow as hvd
if not hvd.mpi_built():
    raise SystemExit("Horovod was built without MPI support (is libopenmpi-dev installed?)")
print("Horovod", horovod.__version__, "with TensorFlow and MPI")
PYCHECK
  ) || { [[ ${1:-} == quiet ]] && return 1; printf '%s\n' "$out" >&2
         die "Horovod is not usable; rebuild with: rm -rf '$CACHE_DIR' && make setup"; }
  [[ ${1:-} == quiet ]] || say "$(tail -n1 <<<"$out")"
}

main() {
  install_debian_packages
  create_venv
  install_python_packages
  install_horovod
  check_horovod
  "$PY" -m pip check >/dev/null || { "$PY" -m pip check >&2; die "inconsistent packages in .venv"; }
  say "ready: $VENV"
}

main "$@"
