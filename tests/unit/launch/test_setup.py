"""``launch/setup.sh``: the GPU branch (a stand-in nvidia-smi), offline installs, and its refusals."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mpi_jobs

SETUP = Path(__file__).resolve().parents[3] / "launch" / "setup.sh"


def _stand_in_nvidia_smi(tmp_path: Path, gpus: int) -> str:
    """A directory holding an nvidia-smi that lists ``gpus`` GPUs, to put first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    listing = "".join(f"echo 'GPU {g}: NVIDIA H100 80GB HBM3 (UUID: GPU-{g})'\n" for g in range(gpus))
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + listing)
    (bin_dir / "nvidia-smi").chmod(0o755)
    return str(bin_dir)


def _setup(tmp_path: Path, *args: str, gpus: int = 0, offline_namespace: bool = False, **env: str):
    """Run setup.sh with ``env`` over this environment (this venv), optionally without any network."""
    environment = {**os.environ, "HYBRID_VENV": sys.prefix, **env,
                   "PATH": f"{_stand_in_nvidia_smi(tmp_path, gpus)}:{env.get('PATH', os.environ['PATH'])}"}
    command = ["bash", str(SETUP), *args]
    if offline_namespace:
        command = ["unshare", "--net", *command]
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=300)


def _no_network_namespace() -> str:
    """Why a network namespace cannot be made here ('' when it can)."""
    try:
        probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return "unshare is not installed"
    return "" if probe.returncode == 0 else f"unshare --net fails here: {probe.stderr.strip()}"


def test_a_gpu_host_plans_a_cuda_pytorch_and_horovod_with_nccl_from_the_wheel_directory(tmp_path):
    result = _setup(tmp_path, "--plan", gpus=2, HYBRID_OFFLINE="1", HYBRID_WHEEL_DIR=str(tmp_path / "wheels"))
    assert result.returncode == 0, result.stderr
    family = mpi_jobs.FAMILY.name  # this venv's, kept: setup.sh reads it from HYBRID_VENV
    wheels = tmp_path / "wheels" / ("mpich" if family == "mpich" else "")
    assert [line for line in result.stderr.splitlines() if "mpi4py" not in line] == [
        f"[setup] plan: MPI: {family} (the MPI {sys.prefix} was set up with): {_wrappers(family)}",
        "[setup] plan: GPU build: yes (nvidia-smi lists 2 GPU(s))",
        "[setup] plan: torch: pip install torch==2.13.0 (a CUDA build)",
        f"[setup] plan: Horovod 0.28.1: HOROVOD_GPU_OPERATIONS=NCCL, built against {family}, "
        f"wheel cached in {wheels / 'nccl'}",
        f"[setup] plan: packages: only from {tmp_path}/wheels (pip --no-index --find-links)",
        f"[setup] plan: virtualenv: {sys.prefix}",
    ]


def _wrappers(family: str) -> str:
    """The compiler wrapper and launcher setup.sh picks for ``family`` here: Debian's suffixed names."""
    suffixed = {"openmpi": ("mpicc.openmpi", "mpirun.openmpi"), "mpich": ("mpicc.mpich", "mpiexec.mpich")}[family]
    plain = {"openmpi": ("mpicc", "mpirun"), "mpich": ("mpicc", "mpiexec")}[family]
    return ", ".join(shutil.which(a) or b for a, b in zip(suffixed, plain))


def test_a_host_without_gpus_plans_the_cpu_build_from_the_index(tmp_path):
    result = _setup(tmp_path, "--plan", gpus=0, HYBRID_WHEEL_DIR=str(tmp_path / "wheels"),
                    HYBRID_TORCH_INDEX="https://example.invalid/simple")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "MPI:" not in line and "mpi4py" not in line]
    assert lines[0] == "[setup] plan: GPU build: no (no GPU listed by nvidia-smi)"
    assert lines[1] == "[setup] plan: torch: pip install torch==2.13.0 (CPU)"
    assert "HOROVOD_GPU_OPERATIONS=none" in lines[2] and lines[3] == "[setup] plan: packages: pip's index"


def test_mpich_gets_a_venv_and_wheels_of_its_own_and_mpi4py_built_against_it(tmp_path):
    venv = tmp_path / "new-venv"
    result = _setup(tmp_path, "--plan", HYBRID_MPI="mpich", HYBRID_VENV=str(venv),
                    HYBRID_WHEEL_DIR=str(tmp_path / "wheels"))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"[setup] plan: MPI: mpich (HYBRID_MPI=mpich): {_wrappers('mpich')}")
    assert f"[setup] plan: mpi4py: built against {_wrappers('mpich').split(', ')[0]}, wheel cached in " \
           f"{tmp_path}/wheels/mpich" in lines
    assert any(line.endswith(f"built against mpich, wheel cached in {tmp_path}/wheels/mpich") for line in lines)
    assert lines[-1] == f"[setup] plan: virtualenv: {venv}"
    without_venv = {key: value for key, value in os.environ.items() if key != "HYBRID_VENV"}
    plan = subprocess.run(["bash", str(SETUP), "--plan"], capture_output=True, text=True, timeout=60,
                          env={**without_venv, "HYBRID_MPI": "mpich"}).stderr
    assert plan.splitlines()[-1] == f"[setup] plan: virtualenv: {SETUP.parents[1] / '.venv-mpich'}"


def _path_with_only_open_mpi(tmp_path: Path) -> str:
    """A PATH like this one's, without any MPICH, whose plain mpicc/mpiexec/mpirun are Open MPI's (stand-ins)."""
    sandbox = tmp_path / "only-open-mpi"
    sandbox.mkdir()
    for name in ("mpicc", "mpiexec", "mpirun"):
        (sandbox / name).write_text("#!/bin/sh\necho 'mpiexec (OpenRTE) 4.1.4'\n")
        (sandbox / name).chmod(0o755)
    for directory in os.environ["PATH"].split(":"):
        for tool in Path(directory).glob("*") if Path(directory).is_dir() else ():
            if "mpi" not in tool.name and not (sandbox / tool.name).exists():
                (sandbox / tool.name).symlink_to(tool)
    return str(sandbox)


def test_mpich_asked_for_where_only_open_mpi_is_installed_is_installed_not_refused(tmp_path):
    """The plain mpicc/mpiexec are Open MPI's on such a host: the plan installs MPICH, and only where
    it cannot (offline here) is the request refused, naming what was found and what to install."""
    venv = tmp_path / "new-venv"
    path = _path_with_only_open_mpi(tmp_path)
    plan = _setup(tmp_path, "--plan", HYBRID_MPI="mpich", HYBRID_VENV=str(venv), PATH=path)
    assert plan.returncode == 0, plan.stderr
    assert plan.stderr.splitlines()[0].endswith(", from apt-get install mpich libmpich-dev")
    refused = _setup(tmp_path, HYBRID_MPI="mpich", HYBRID_VENV=str(venv), HYBRID_OFFLINE="1", PATH=path)
    assert refused.returncode == 1
    assert "HYBRID_MPI=mpich, but mpiexec is another MPI:" in refused.stderr
    assert "sudo apt-get install -y mpich libmpich-dev" in refused.stderr
    assert not venv.exists()


def test_a_missing_compiler_wrapper_of_the_mpi_found_is_not_found_not_another_mpi(tmp_path):
    path = _path_with_only_open_mpi(tmp_path)
    (Path(path) / "mpicc").unlink()
    refused = _setup(tmp_path, HYBRID_MPI="openmpi", HYBRID_VENV=str(tmp_path / "v"), HYBRID_OFFLINE="1", PATH=path)
    assert refused.returncode == 1
    assert "mpicc/mpirun not found: install openmpi first" in refused.stderr and "another MPI" not in refused.stderr


def test_a_gpu_host_with_its_own_pytorch_and_an_index_plans_that_index(tmp_path):
    plan = _setup(tmp_path, "--plan", gpus=1, HYBRID_TORCH_INDEX="https://download.example/cu130").stderr
    assert "torch: pip install torch==2.13.0 --index-url https://download.example/cu130 (a CUDA build)" in plan
    plan = _setup(tmp_path, "--plan", gpus=1, HYBRID_TORCH="system").stderr
    assert "torch: the python's own (virtualenv with system site packages), must be a CUDA build" in plan


@pytest.mark.parametrize("env,message", [({"HYBRID_GPU": "yes"}, "HYBRID_GPU must be auto, 0 or 1, got 'yes'"),
                                         ({"HYBRID_TORCH": "conda"}, "HYBRID_TORCH must be pip or system"),
                                         ({"HYBRID_MPI": "lam"}, "HYBRID_MPI must be openmpi or mpich, got 'lam'")])
def test_bad_settings_are_refused_before_anything_is_installed(tmp_path, env, message):
    result = _setup(tmp_path, **env)
    assert result.returncode == 2 and message in result.stderr


@pytest.mark.job
@pytest.mark.skipif(bool(_no_network_namespace()), reason=_no_network_namespace() or "runs")
def test_a_set_up_machine_checks_out_offline_without_any_network(tmp_path):
    result = _setup(tmp_path, offline_namespace=True, HYBRID_OFFLINE="1")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1] == \
        f"[setup] ready ({mpi_jobs.FAMILY.name}): activate with 'source {sys.prefix}/bin/activate'"


@pytest.mark.job
@pytest.mark.any_mpi_family  # the GPU branch's refusal reads torch alone: the same under either MPI
@pytest.mark.skipif(bool(_no_network_namespace()), reason=_no_network_namespace() or "runs")
@pytest.mark.skipif(torch.version.cuda is not None, reason="this PyTorch is a CUDA build")
def test_a_gpu_host_refuses_a_cpu_build_of_pytorch_saying_what_to_do_and_changes_nothing(tmp_path):
    result = _setup(tmp_path, gpus=1, offline_namespace=True, HYBRID_OFFLINE="1", HYBRID_TORCH="system")
    assert result.returncode == 1
    assert f"this is a GPU host (nvidia-smi lists 1 GPU(s)), but torch {torch.__version__} is a CPU build" \
        in result.stderr
    assert "or set HYBRID_GPU=0 for CPU workers" in result.stderr
    check = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                           text=True, timeout=120)
    assert check.stdout.strip() == torch.__version__


@pytest.mark.job
@pytest.mark.any_mpi_family  # the GPU branch's refusal reads torch alone: the same under either MPI
@pytest.mark.skipif(bool(_no_network_namespace()), reason=_no_network_namespace() or "runs")
@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs a python that runs from a venv")
@pytest.mark.skipif(torch.version.cuda is not None, reason="this PyTorch is a CUDA build")
def test_system_pytorch_in_a_venv_is_seen_from_the_new_venv(tmp_path):
    """The device image's case: python3 runs from a venv holding PyTorch; a new venv must import that torch.

    Its torch is this venv's CPU build, so the GPU branch refuses it: the refusal names the version,
    which only a venv that sees the parent's packages can know (otherwise: "cannot import torch").
    """
    new_venv = tmp_path / "site-venv"
    result = _setup(tmp_path, gpus=1, offline_namespace=True, HYBRID_OFFLINE="1", HYBRID_TORCH="system",
                    HYBRID_VENV=str(new_venv), PATH=f"{sys.prefix}/bin:{os.environ['PATH']}")
    assert result.returncode == 1, result.stderr
    assert f"but torch {torch.__version__} is a CPU build" in result.stderr, result.stderr


@pytest.mark.job
@pytest.mark.skipif(bool(_no_network_namespace()), reason=_no_network_namespace() or "runs")
def test_building_horovods_wheel_where_it_already_imports_builds_and_installs_nothing(tmp_path):
    """The GPU check's background step (setup.sh --horovod-wheel) on a venv that has Horovod: says so, offline."""
    result = _setup(tmp_path, "--horovod-wheel", offline_namespace=True, HYBRID_OFFLINE="1",
                    HYBRID_WHEEL_DIR=str(tmp_path / "wheels"))
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"[setup] Horovod already imports in {sys.prefix}: nothing to build"
    assert not (tmp_path / "wheels").exists()


def test_an_unknown_option_names_the_options(tmp_path):
    result = _setup(tmp_path, "--horovod")
    assert result.returncode == 2
    assert result.stderr.strip() == "[setup] unknown option --horovod (expected --plan, --download, --horovod-wheel or --deps-only)"
