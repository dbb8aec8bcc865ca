#!/usr/bin/env bash
# Idempotent set-up of everything the project needs on a fresh Debian machine:
# OpenMPI, a virtualenv, pinned PyTorch, Horovod 0.28.1 built with C++17,
# the package itself (Cython extensions) and the test tools.
#
# A second run only checks: nothing is rebuilt when it already imports.
# On a host whose nvidia-smi lists a GPU it installs a CUDA build of PyTorch and
# builds Horovod with NCCL (docs/setup.md, "GPU hosts").
# Environment:
#   HYBRID_VENV       virtualenv path            (default: <repo>/.venv)
#   HYBRID_WHEEL_DIR  cache of built wheels      (default: ~/.cache/hybrid/wheels)
#   HYBRID_GPU=auto|0|1  the GPU build: auto = when nvidia-smi lists a GPU (default auto)
#   HYBRID_TORCH=pip|system  pip: install torch==TORCH_VERSION; system: use the PyTorch the venv's
#                     python imports (HPC modules, site installs): a new venv sees system site packages
#   HYBRID_TORCH_INDEX  where a GPU host's CUDA PyTorch comes from (default https://pypi.org/simple,
#                     whose Linux wheels are CUDA builds)
#   HYBRID_OFFLINE=1  install only from HYBRID_WHEEL_DIR (pip --no-index); fill it beforehand
#                     on a machine with network: bash launch/setup.sh --download
#   HYBRID_SKIP_HOROVOD=1  skip Horovod (training then needs horovod installed otherwise)
#   HOROVOD_GPU_OPERATIONS  overrides the choice above (NCCL on GPU hosts, empty otherwise)
# Options:
#   --plan      print what would be installed and from where, change nothing
#   --download  download every package into HYBRID_WHEEL_DIR for a later HYBRID_OFFLINE=1 run
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HYBRID_VENV:-$ROOT/.venv}
WHEEL_DIR=${HYBRID_WHEEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid/wheels}
TORCH_VERSION=2.13.0
HOROVOD_VERSION=0.28.1
GPU=${HYBRID_GPU:-auto}
TORCH_SOURCE=${HYBRID_TORCH:-pip}
TORCH_INDEX=${HYBRID_TORCH_INDEX:-https://pypi.org/simple}
OFFLINE=${HYBRID_OFFLINE:-0}
ACTION=install
case "${1:-}" in
    "") ;;
    --plan) ACTION=plan ;;
    --download) ACTION=download ;;
    *) printf '[setup] unknown option %s (expected --plan or --download)\n' "$1" >&2; exit 2 ;;
esac

say() { printf '[setup] %s\n' "$*" >&2; }

# pip, quiet, without the "Location ... is ignored" lines some machines' pip config causes.
pip_quiet() {
    local status
    "$PY" -m pip --disable-pip-version-check -q "$@" 2>&1 | { grep -v '^WARNING: Location' || true; } >&2
    status=${PIPESTATUS[0]}
    return "$status"
}

# Where pip takes packages from: the index, or (offline) the wheel directory alone.
pip_install() {
    if [ "$OFFLINE" = 1 ]; then
        pip_quiet install --no-index --find-links "$WHEEL_DIR" "$@"
    else
        pip_quiet install "$@"
    fi
}

# GPU build or not: HYBRID_GPU, or (auto) whether nvidia-smi lists a GPU.
decide_gpu() {
    case "$GPU" in
        auto)
            local n=0
            if command -v nvidia-smi >/dev/null 2>&1; then
                n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
            fi
            if [ "$n" -gt 0 ]; then GPU=1; GPU_WHY="nvidia-smi lists $n GPU(s)"
            else GPU=0; GPU_WHY="no GPU listed by nvidia-smi"; fi ;;
        0|1) GPU_WHY="HYBRID_GPU=$GPU" ;;
        *) say "HYBRID_GPU must be auto, 0 or 1, got '$GPU'"; exit 2 ;;
    esac
    case "$TORCH_SOURCE" in
        pip|system) ;;
        *) say "HYBRID_TORCH must be pip or system, got '$TORCH_SOURCE'"; exit 2 ;;
    esac
    GPU_OPS=${HOROVOD_GPU_OPERATIONS-$([ "$GPU" = 1 ] && echo NCCL || true)}
    # The Horovod wheel links against one torch build and one set of GPU operations.
    HOROVOD_DIR=$WHEEL_DIR${GPU_OPS:+/$(echo "$GPU_OPS" | tr '[:upper:]' '[:lower:]')}
}

# The torch requirement: from the usual sources on CPU hosts, from HYBRID_TORCH_INDEX on GPU hosts.
torch_install_args() {
    TORCH_ARGS=("torch==$TORCH_VERSION")
    if [ "$GPU" = 1 ] && [ "$OFFLINE" != 1 ]; then
        TORCH_ARGS+=(--index-url "$TORCH_INDEX")
    fi
}

print_plan() {
    torch_install_args
    say "plan: GPU build: $([ "$GPU" = 1 ] && echo yes || echo no) ($GPU_WHY)"
    if [ "$TORCH_SOURCE" = system ]; then
        say "plan: torch: the python's own (virtualenv with system site packages)$([ "$GPU" = 1 ] && echo ', must be a CUDA build')"
    else
        say "plan: torch: pip install ${TORCH_ARGS[*]}$([ "$GPU" = 1 ] && echo ' (a CUDA build)' || echo ' (CPU)')"
    fi
    say "plan: Horovod $HOROVOD_VERSION: HOROVOD_GPU_OPERATIONS=${GPU_OPS:-none}, wheel cached in $HOROVOD_DIR"
    if [ "$OFFLINE" = 1 ]; then
        say "plan: packages: only from $WHEEL_DIR (pip --no-index --find-links)"
    else
        say "plan: packages: pip's index"
    fi
    say "plan: virtualenv: $VENV"
}

install_openmpi() {
    if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
        return
    fi
    if [ "$(id -u)" -ne 0 ] || [ "$OFFLINE" = 1 ]; then
        say "mpicc/mpirun not found: install OpenMPI first, e.g."
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
        if [ "$TORCH_SOURCE" = system ]; then
            python3 -m venv --system-site-packages "$VENV"
        else
            python3 -m venv "$VENV"
        fi
    fi
    PY="$VENV/bin/python"
    PIP=(pip_install)
    # pip < 23.3 runs setuptools' deprecated 'develop' for editable installs.
    "$PY" -c "import pip, sys; sys.exit(int(pip.__version__.split('.')[0]) < 24)" 2>/dev/null \
        || "${PIP[@]}" --upgrade "pip>=24"
}

# "VERSION CUDA" of the torch the venv imports (CUDA: its CUDA version, or None), or nothing.
torch_build() {
    "$PY" -c "import torch; print(torch.__version__, torch.version.cuda)" 2>/dev/null || true
}

# torch as HYBRID_TORCH and the GPU build ask; TORCH_PIN: the version the rest must keep.
install_torch() {
    local build version cuda
    build=$(torch_build)
    version=${build%% *} cuda=${build##* }
    if [ "$TORCH_SOURCE" = system ]; then
        if [ -z "$build" ]; then
            say "HYBRID_TORCH=system, but $PY cannot import torch: load the PyTorch module first (a new"
            say "  virtualenv sees system site packages; an existing one must already import torch)"
            exit 1
        fi
    elif [ -z "$build" ] || [ "${version%%+*}" != "$TORCH_VERSION" ] || { [ "$GPU" = 1 ] && [ "$cuda" = None ]; }; then
        torch_install_args
        say "installing ${TORCH_ARGS[*]} ($([ "$GPU" = 1 ] && echo 'CUDA build' || echo CPU))"
        # A CPU build of the same version satisfies the pin: pip would keep it.
        [ -n "$build" ] && pip_quiet uninstall -y torch
        "${PIP[@]}" "${TORCH_ARGS[@]}"
        build=$(torch_build)
        version=${build%% *} cuda=${build##* }
    fi
    if [ "$GPU" = 1 ] && [ "$cuda" = None ]; then
        say "this is a GPU host ($GPU_WHY), but torch $version is a CPU build."
        say "  Give a CUDA build (HYBRID_TORCH_INDEX, or its wheel in $WHEEL_DIR with HYBRID_OFFLINE=1),"
        say "  or set HYBRID_GPU=0 for CPU workers."
        exit 1
    fi
    TORCH_PIN="torch==$version"
}

install_python_deps() {
    # Skip the resolver (slow) when the requirements did not change since the last run.
    local stamp="$VENV/.hybrid-requirements" want
    want=$(cat "$ROOT/launch/requirements.txt"; echo "$TORCH_PIN")
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        say "installing Python dependencies"
        "${PIP[@]}" -r "$ROOT/launch/requirements.txt" "$TORCH_PIN"
        printf '%s' "$want" >"$stamp"
    fi
}

# Horovod's NCCL build needs NCCL's headers and a libnccl.so. CUDA builds of PyTorch bring NCCL as
# a wheel (nvidia/nccl in site-packages) whose library is only libnccl.so.2: link it under that name.
nccl_from_wheel() {
    [ -n "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_INCLUDE:-}" ] && return
    local dir
    dir=$("$PY" -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) or list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
    [ -n "$dir" ] && [ -f "$dir/include/nccl.h" ] || return 0
    mkdir -p "$1/lib"
    ln -sf "$dir"/lib/libnccl.so.* "$1/lib/"
    ln -sf "$(ls "$dir"/lib/libnccl.so.* | head -n 1)" "$1/lib/libnccl.so"
    export HOROVOD_NCCL_INCLUDE="$dir/include" HOROVOD_NCCL_LIB="$1/lib"
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
    if [ -n "$GPU_OPS" ]; then
        command -v nvcc >/dev/null 2>&1 || [ -x "${HOROVOD_CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] || {
            say "building Horovod with $GPU_OPS needs the CUDA toolkit (nvcc): put it on PATH or set"
            say "  HOROVOD_CUDA_HOME; or HYBRID_GPU=0 for CPU workers"
            exit 1
        }
        nccl_from_wheel "$wrapdir/nccl"
    fi
    mkdir -p "$HOROVOD_DIR"
    say "building Horovod $HOROVOD_VERSION with C++17${GPU_OPS:+ and $GPU_OPS} (takes about 5 minutes)"
    local log="$HOROVOD_DIR/horovod-build.log" sources=()
    [ "$OFFLINE" = 1 ] && sources=(--no-index --find-links "$WHEEL_DIR")
    if ! CXX="$wrapdir/g++" CC=/usr/bin/gcc \
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_GPU_OPERATIONS="$GPU_OPS" MAKEFLAGS="-j$(nproc)" \
        pip_quiet wheel --no-build-isolation --no-deps --no-binary horovod "${sources[@]}" \
            -w "$HOROVOD_DIR" "horovod==$HOROVOD_VERSION" >"$log" 2>&1; then
        say "Horovod build failed; last lines of $log:"
        tail -n 40 "$log" >&2
        rm -rf "$wrapdir"
        exit 1
    fi
    rm -rf "$wrapdir"
}

horovod_ok() {
    local built="hvd.mpi_built()"
    [ -n "$GPU_OPS" ] && built="hvd.mpi_built() and hvd.nccl_built()"
    "$PY" -c "import horovod.torch as hvd; import sys; sys.exit(not ($built))" 2>/dev/null
}

install_horovod() {
    if [ "${HYBRID_SKIP_HOROVOD:-0}" = 1 ] || horovod_ok; then
        return
    fi
    # The wheel links against this torch build: cache it per torch version.
    local wheel stamp="$HOROVOD_DIR/${TORCH_PIN/==/-}.stamp"
    wheel=$(ls "$HOROVOD_DIR"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n 1 || true)
    if [ -z "$wheel" ] || [ ! -f "$stamp" ]; then
        rm -f "$HOROVOD_DIR"/horovod-*.whl
        "${PIP[@]}" cmake
        build_horovod_wheel
        touch "$stamp"
        wheel=$(ls "$HOROVOD_DIR"/horovod-"$HOROVOD_VERSION"-*.whl | head -n 1)
    fi
    say "installing $wheel"
    "${PIP[@]}" --no-deps --force-reinstall "$wheel"
    "${PIP[@]}" cloudpickle psutil pyyaml packaging cffi
    horovod_ok || { say "Horovod installed but 'import horovod.torch' fails${GPU_OPS:+ or has no $GPU_OPS}"; exit 1; }
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
    if ! "${PIP[@]}" --no-build-isolation --no-deps -e "$ROOT" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        say "building the package failed (full log: $log)"
        exit 1
    fi
    printf '%s' "$want" >"$stamp"
}

# Every package a later HYBRID_OFFLINE=1 run installs, into HYBRID_WHEEL_DIR (this platform's builds).
download_all() {
    PY=${PY:-python3}
    torch_install_args
    mkdir -p "$WHEEL_DIR"
    say "downloading into $WHEEL_DIR"
    pip_quiet download -d "$WHEEL_DIR" "${TORCH_ARGS[@]}"
    pip_quiet download -d "$WHEEL_DIR" -r "$ROOT/launch/requirements.txt" "pip>=24" cmake \
        cloudpickle psutil pyyaml packaging cffi
    pip_quiet download -d "$WHEEL_DIR" --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION"
    say "done: run HYBRID_OFFLINE=1 HYBRID_WHEEL_DIR=$WHEEL_DIR bash launch/setup.sh where there is no network"
}

decide_gpu
case "$ACTION" in
    plan) print_plan; exit 0 ;;
    download) download_all; exit 0 ;;
esac
install_openmpi
make_venv
install_torch
install_python_deps
install_horovod
install_package
say "ready$([ "$GPU" = 1 ] && echo ' (GPU build)'): activate with 'source $VENV/bin/activate'"
