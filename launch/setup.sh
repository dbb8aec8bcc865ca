#!/usr/bin/env bash
# Idempotent set-up of everything the project needs on a fresh Debian machine:
# OpenMPI, a virtualenv, pinned PyTorch (CPU), Horovod 0.28.1 built with C++17,
# the package itself (Cython extensions) and the test tools.
#
# A second run only checks: nothing is rebuilt when it already imports.
# Environment:
#   HYBRID_VENV       virtualenv path            (default: <repo>/.venv)
#   HYBRID_WHEEL_DIR  cache of built wheels      (default: ~/.cache/hybrid/wheels)
#   HYBRID_SKIP_HOROVOD=1  skip Horovod (training then needs horovod installed otherwise)
#   HOROVOD_GPU_OPERATIONS=NCCL  on GPU machines (with CUDA), for the GPU training path
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HYBRID_VENV:-$ROOT/.venv}
WHEEL_DIR=${HYBRID_WHEEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid/wheels}
TORCH_VERSION=2.13.0
HOROVOD_VERSION=0.28.1

say() { printf '[setup] %s\n' "$*" >&2; }

# pip, quiet, without the "Location ... is ignored" lines some machines' pip config causes.
pip_quiet() {
    local status
    "$PY" -m pip --disable-pip-version-check -q "$@" 2>&1 | { grep -v '^WARNING: Location' || true; } >&2
    status=${PIPESTATUS[0]}
    return "$status"
}

install_openmpi() {
    if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
        return
    fi
    if [ "$(id -u)" -ne 0 ]; then
        say "mpicc/mpirun not found and not root: install OpenMPI first, e.g."
        say "  sudo apt-get install -y openmpi-bin libopenmpi-dev"
        exit 1
    fi
    say "installing OpenMPI from Debian (openmpi-bin libopenmpi-dev)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
}

make_venv() {
    if [ ! -x "$VENV/bin/python" ]; then
        say "creating virtualenv $VENV"
        python3 -m venv "$VENV"
    fi
    PY="$VENV/bin/python"
    PIP=(pip_quiet)
    # pip < 23.3 runs setuptools' deprecated 'develop' for editable installs.
    "$PY" -c "import pip, sys; sys.exit(int(pip.__version__.split('.')[0]) < 24)" 2>/dev/null \
        || "${PIP[@]}" install --upgrade "pip>=24"
}

install_python_deps() {
    if ! "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
        say "installing torch==$TORCH_VERSION (CPU)"
        "${PIP[@]}" install "torch==$TORCH_VERSION"
    fi
    # Skip the resolver (slow) when the requirements did not change since the last run.
    local stamp="$VENV/.hybrid-requirements" want
    want=$(cat "$ROOT/launch/requirements.txt"; echo "torch==$TORCH_VERSION")
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        say "installing Python dependencies"
        "${PIP[@]}" install -r "$ROOT/launch/requirements.txt" "torch==$TORCH_VERSION"
        printf '%s' "$want" >"$stamp"
    fi
}

# Horovod 0.28.1 hard-codes -std=c++14, but PyTorch >= 2.1 headers need C++17.
# A compiler wrapper rewrites the flag; everything else goes to the real g++.
build_horovod_wheel() {
    local wrapdir
    wrapdir=$(mktemp -d)
    cat >"$wrapdir/g++" <<'WRAP'
#!/usr/bin/env bash
args=()
for a in "$@"; do
    case "$a" in -std=c++14|-std=c++11|-std=gnu++14) a=-std=c++17 ;; esac
    args+=("$a")
done
exec /usr/bin/g++ "${args[@]}"
WRAP
    chmod +x "$wrapdir/g++"
    mkdir -p "$WHEEL_DIR"
    say "building Horovod $HOROVOD_VERSION with C++17 (takes about 5 minutes)"
    local log="$WHEEL_DIR/horovod-build.log"
    if ! CXX="$wrapdir/g++" CC=/usr/bin/gcc \
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_GPU_OPERATIONS="${HOROVOD_GPU_OPERATIONS:-}" MAKEFLAGS="-j$(nproc)" \
        "${PIP[@]}" wheel --no-build-isolation --no-deps --no-binary horovod \
            -w "$WHEEL_DIR" "horovod==$HOROVOD_VERSION" >"$log" 2>&1; then
        say "Horovod build failed; last lines of $log:"
        tail -n 40 "$log" >&2
        rm -rf "$wrapdir"
        exit 1
    fi
    rm -rf "$wrapdir"
}

horovod_ok() {
    "$PY" -c "import horovod.torch as hvd; import sys; sys.exit(not hvd.mpi_built())" 2>/dev/null
}

install_horovod() {
    if [ "${HYBRID_SKIP_HOROVOD:-0}" = 1 ] || horovod_ok; then
        return
    fi
    # The wheel links against this torch build: cache it per torch version.
    local wheel
    wheel=$(ls "$WHEEL_DIR"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n 1 || true)
    if [ -z "$wheel" ] || [ ! -f "$WHEEL_DIR/torch-$TORCH_VERSION.stamp" ]; then
        rm -f "$WHEEL_DIR"/horovod-*.whl
        "${PIP[@]}" install cmake
        build_horovod_wheel
        touch "$WHEEL_DIR/torch-$TORCH_VERSION.stamp"
        wheel=$(ls "$WHEEL_DIR"/horovod-"$HOROVOD_VERSION"-*.whl | head -n 1)
    fi
    say "installing $wheel"
    "${PIP[@]}" install --no-deps --force-reinstall "$wheel"
    "${PIP[@]}" install cloudpickle psutil pyyaml packaging cffi
    horovod_ok || { say "Horovod installed but 'import horovod.torch' fails"; exit 1; }
}

# Rebuild the Cython kernels only when their sources or setup.py changed.
install_package() {
    local stamp="$VENV/.hybrid-package" want
    want=$(cd "$ROOT" && cat setup.py pyproject.toml cython_ext/*.pyx cython_ext/*.pxd | sha256sum)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && (cd /tmp && "$PY" -c "import hybrid.cli") 2>/dev/null \
        && [ "$(cd /tmp && "$PY" -c 'import hybrid, os; print(os.path.dirname(os.path.dirname(hybrid.__file__)))')" = "$ROOT" ]; then
        return
    fi
    say "building the hybrid package (Cython extensions)"
    local log="$VENV/hybrid-build.log"
    if ! "${PIP[@]}" install --no-build-isolation --no-deps -e "$ROOT" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        say "building the package failed (full log: $log)"
        exit 1
    fi
    printf '%s' "$want" >"$stamp"
}

install_openmpi
make_venv
install_python_deps
install_horovod
install_package
say "ready: activate with 'source $VENV/bin/activate'"
