"""The launchers under each MPI family: ``launch/mpirun.sh`` prints what it runs and gives each family its
options; ``--tcp`` adds the transport a TCP cluster needs; ``launch/train.sh`` lays out the ranks."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mpi_jobs

LAUNCHER = Path(__file__).resolve().parents[3] / "launch" / "mpirun.sh"


def _stand_in_venv(tmp_path: Path, family: str) -> Path:
    """A venv marked as set up with ``family``, whose launcher prints its arguments; its python is this one."""
    venv = tmp_path / f"venv-{family}"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (venv / "bin" / "launcher").write_text('#!/bin/sh\necho "launched: $*"\n')
    for tool in ("python", "launcher"):
        (venv / "bin" / tool).chmod(0o755)
    (venv / ".hybrid-mpi").write_text(f"{family} {venv / 'bin' / 'launcher'}\n")
    return venv


def _launch(venv, *args: str) -> tuple[str, str]:
    """What launch/mpirun.sh ran under ``venv``'s MPI (stdout) and the lines it printed first ('+ ...')."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OMPI_MCA", "UCX_", "HYDRA_"))}
    result = subprocess.run(["bash", str(LAUNCHER), *args], capture_output=True, text=True, timeout=60,
                            env={**env, "HYBRID_VENV": str(venv)})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip(), " ".join(line for line in result.stderr.splitlines() if line.startswith("+ "))


def test_the_launcher_runs_the_mpi_this_venv_was_set_up_with():
    ran, printed = _launch(sys.prefix, "--version")
    assert any(marker in ran for marker in mpi_jobs.FAMILY.version_markers), ran
    assert printed.startswith(f"+ {mpi_jobs.FAMILY.mpiexec} ")


def test_open_mpi_runs_as_root_oversubscribed_unbound_with_the_options_as_given(tmp_path):
    ran, printed = _launch(_stand_in_venv(tmp_path, "openmpi"), "-n", "3", "-x", "A", "-H", "h1:2,h2:1",
                           "--map-by", "slot", "python", "-x", "y")
    assert ran == "launched: --allow-run-as-root --oversubscribe --bind-to none -n 3 -x A -H h1:2,h2:1 " \
                  "--map-by slot python -x y"
    assert "osc" not in printed


def test_mpich_gets_open_mpi_options_translated_before_the_command_and_the_command_untouched(tmp_path):
    ran, _ = _launch(_stand_in_venv(tmp_path, "mpich"), "-n", "3", "-x", "A", "-H", "h1:2,h2:1", "--map-by", "slot",
                     "-l", "-genv", "B", "2", "-ppn", "2", "-x", "C", "python", "-x", "y", "-H", "z")
    assert ran == "launched: -n 3 -hosts h1:2,h2:1 -l -genv B 2 -ppn 2 python -x y -H z"


def test_mpich_refuses_a_mapping_it_cannot_translate(tmp_path):
    venv = _stand_in_venv(tmp_path, "mpich")
    result = subprocess.run(["bash", str(LAUNCHER), "-n", "2", "--map-by", "core", "python"], capture_output=True,
                            text=True, timeout=60, env={**os.environ, "HYBRID_VENV": str(venv)})
    assert result.returncode == 2 and "--map-by core has no translation" in result.stderr


def test_a_venv_that_does_not_exist_is_refused_saying_how_to_make_it(tmp_path):
    result = subprocess.run(["bash", str(LAUNCHER), "-n", "2", "python"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "HYBRID_VENV": str(tmp_path / "missing")})
    assert result.returncode == 2 and "has no bin/python: make it with launch/setup.sh" in result.stderr


@pytest.mark.parametrize("family", ["openmpi", "mpich"])
def test_tcp_selects_ucx_eager_sends_on_the_interface_in_each_familys_terms(tmp_path, family):
    ran, printed = _launch(_stand_in_venv(tmp_path, family), "--tcp=lo", "-n", "2", "python")
    for setting in ("UCX_TLS=tcp,self", "UCX_RNDV_THRESH=inf", "UCX_NET_DEVICES=lo"):
        assert setting in printed
    open_mpi = ("OMPI_MCA_pml=ucx", "OMPI_MCA_osc=ucx", "OMPI_MCA_osc_ucx_tls=any",
                "OMPI_MCA_coll_tuned_allreduce_algorithm=4", "OMPI_MCA_btl_tcp_if_include=lo")
    if family == "openmpi":
        assert all(setting in printed for setting in open_mpi) and "HYDRA_IFACE" not in printed
        assert "-x UCX_TLS -x UCX_RNDV_THRESH -x UCX_NET_DEVICES -n 2" in ran
    else:  # Hydra forwards the whole environment; its own connections take the interface from HYDRA_IFACE
        assert "HYDRA_IFACE=lo" in printed and "OMPI_MCA" not in printed
        assert ran == "launched: -n 2 python"


TRAIN = LAUNCHER.parent / "train.sh"
RANK_ENV = LAUNCHER.parent / "rank_env.sh"


def _dry_run(*args: str, venv=sys.prefix) -> list[str]:
    result = subprocess.run(["bash", str(TRAIN), "--dry-run", *args], capture_output=True, text=True, timeout=60,
                            cwd=LAUNCHER.parents[1], env={**os.environ, "HYBRID_VENV": str(venv)})
    assert result.returncode == 0, result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("+ ")]


def test_train_launcher_refuses_a_python_without_the_packages_saying_how_to_get_them(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    result = subprocess.run(["bash", str(TRAIN), "configs/ml100k.yaml"], capture_output=True, text=True, timeout=60,
                            cwd=LAUNCHER.parents[1], env={**os.environ, "HYBRID_VENV": str(bare)})
    assert result.returncode == 2
    assert result.stderr.startswith(f"launch/train.sh: {bare}/bin/python lacks the packages launch/setup.sh installs")
    assert "activate its venv (source " in result.stderr and "Traceback" not in result.stderr


def test_train_launcher_takes_the_rank_layout_from_the_config_and_places_ps_ranks_last():
    layout, command = _dry_run("--workers-on", "gpu1:4,gpu2:4", "--ps-on", "cpu1:2", "--tcp=eth0",
                               "configs/w1.yaml", "cluster.ps=2", "--resume")
    assert layout == "+ HYBRID_WORKERS=8 HYBRID_PS=2 HYBRID_RANKS=10 HYBRID_CHECKPOINT_DIR=checkpoints/w1"
    assert "mpirun.sh --tcp=eth0 -n 10 -H gpu1:4\\,gpu2:4\\,cpu1:2 --map-by slot -x HYBRID_WORKERS" in command
    assert command.endswith("rank_env.sh python -m hybrid train configs/w1.yaml cluster.ps=2 --resume ")


def test_train_launcher_with_horovodrun_prints_its_exact_command(tmp_path):
    _, command = _dry_run("--horovodrun", "configs/w1-smoke.yaml", venv=_stand_in_venv(tmp_path, "openmpi"))
    assert command.startswith("+ horovodrun -np 4 -H localhost:4 --mpi-args=--allow-run-as-root\\ --oversubscribe")
    _, command = _dry_run("--horovodrun", "configs/w1-smoke.yaml", venv=_stand_in_venv(tmp_path, "mpich"))
    assert command.startswith("+ horovodrun -np 4 -H localhost:4 bash ")  # horovodrun adds MPICH's options


def _rank_env(tmp_path, rank: int, local_rank: int, gpus: int) -> dict:
    """The environment rank_env.sh gives a rank, on a host with ``gpus`` GPUs (a stand-in nvidia-smi)."""
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {g}: stand-in'\n" for g in range(gpus)))
    (tmp_path / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "HYBRID_WORKERS": "3", "OMPI_COMM_WORLD_RANK": str(rank),
           "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank), "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    result = subprocess.run(["bash", str(RANK_ENV), "env"], capture_output=True, text=True, env=env, timeout=30)
    assert result.returncode == 0, result.stderr
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)


def test_ps_ranks_never_get_a_gpu_and_workers_get_one_each(tmp_path):
    assert _rank_env(tmp_path, rank=3, local_rank=3, gpus=4)["CUDA_VISIBLE_DEVICES"] == ""  # the PS rank
    assert _rank_env(tmp_path, rank=1, local_rank=1, gpus=4)["CUDA_VISIBLE_DEVICES"] == "1"
    assert _rank_env(tmp_path, rank=2, local_rank=2, gpus=2)["CUDA_VISIBLE_DEVICES"] == "0"
    assert "CUDA_VISIBLE_DEVICES" not in _rank_env(tmp_path, rank=0, local_rank=0, gpus=0)
    # threads are the rank's own decision, made before MPI starts (hybrid/runtime/launch_facts.py)
    assert "OMP_NUM_THREADS" not in _rank_env(tmp_path, rank=0, local_rank=0, gpus=0)
