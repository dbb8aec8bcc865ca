#!/usr/bin/env bash
# The GPU check: every GPU figure the project needs, from one command on a bare GPU host (docs/gpu.md).
#
#   bash launch/gpu_check.sh --wheels [DIR]   here, with network: the wheel directory the host needs
#                                             (default .gpu-wheels), its size printed
#   bash launch/gpu_check.sh --out DIR        on the GPU host, DIR default $OUT: the stages, about 9 min
#   bash launch/gpu_check.sh --rehearse --out DIR   the same stages here: CPU, stand-in nvidia-smi, tiny sizes
#   bash launch/gpu_check.sh --plan           the stages and their time budgets
#
# Everything but --wheels is hybrid/bench/gpu_check.py, run with the host's python3 (standard library
# only: it runs before set-up).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

say() { printf '[gpu-check] %s\n' "$*" >&2; }

# shellcheck source=launch/pip_quiet.sh
source "$ROOT/launch/pip_quiet.sh"

# What the GPU host lacks, for its Python (3.12, x86-64): packages of launch/requirements.txt its image
# does not have, Horovod's sdist (built there against the host's PyTorch and CUDA), RecBole's wheel
# (MovieLens-100k), and Debian's ip and tc with their libraries (emulated hosts; used only where the
# host has no ip).
make_wheels() {
    local dir=$1
    local target=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
                  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    mkdir -p "$dir"
    say "downloading into $dir"
    pip_quiet download --no-deps --only-binary=:all: "${target[@]}" -d "$dir" \
        omegaconf==2.3.0 pytest-mpi==0.6 cffi==1.17.1 pycparser==2.22 recbole==1.2.1
    pip_quiet wheel --no-deps -w "$dir" antlr4-python3-runtime==4.9.3  # an sdist only: a pure wheel here
    pip_quiet download --no-deps --no-binary :all: -d "$dir" horovod==0.28.1
    iproute2 "$dir/iproute2"
    say "done: $(du -sh "$dir" | cut -f1)B in $(find "$dir" -type f | wc -l) files:"
    ls "$dir" >&2
    local mib
    mib=$(du -sm "$dir" | cut -f1)
    if [ "$mib" -gt 40 ]; then
        say "$dir holds $mib MiB, over the 40 MiB that leaves room for the tree within the 64 MiB a GPU host takes"
        exit 1
    fi
}

# ip and tc from this machine with the libraries they link (glibc apart), each behind a wrapper that
# runs it through the dynamic loader with --library-path: nothing else the host runs sees those libraries.
iproute2() {
    local dest=$1 tool lib
    if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
        say "no ip/tc here (apt-get install iproute2): the GPU host will need its own for emulated hosts"
        return
    fi
    rm -rf "$dest" && mkdir -p "$dest/bin" "$dest/libexec" "$dest/lib"
    for tool in ip tc; do
        cp "$(command -v "$tool")" "$dest/libexec/$tool"
        for lib in $(ldd "$(command -v "$tool")" | awk '/=> \//{print $3}'); do
            case "$(basename "$lib")" in libc.so.*|libm.so.*|ld-linux*) continue ;; esac
            cp -L "$lib" "$dest/lib/"
        done
        cat >"$dest/bin/$tool" <<WRAP
#!/bin/sh
# Debian's $tool, carried for a host without iproute2 (launch/gpu_check.sh --wheels).
here=\$(dirname "\$(readlink -f "\$0")")/..
exec /lib64/ld-linux-x86-64.so.2 --library-path "\$here/lib" "\$here/libexec/$tool" "\$@"
WRAP
        chmod +x "$dest/bin/$tool"
    done
}

case "${1:-}" in
    --wheels) make_wheels "${2:-$ROOT/.gpu-wheels}" ;;
    *) exec python3 -m hybrid.bench.gpu_check "$@" ;;
esac
