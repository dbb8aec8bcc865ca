"""``launch/mpirun.sh``: prints what it runs; ``--tcp`` adds the transport a TCP cluster needs."""
import subprocess
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parents[3] / "launch" / "mpirun.sh"


def _printed_command(*args: str) -> str:
    """What the launcher printed before it ran ``mpirun --version``: settings and command."""
    result = subprocess.run(["bash", str(LAUNCHER), *args, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Open MPI" in result.stdout
    return " ".join(line for line in result.stderr.splitlines() if line.startswith("+ "))


def test_plain_launch_prints_the_command_without_transport_settings():
    command = _printed_command()
    assert "--allow-run-as-root --oversubscribe --bind-to none" in command
    assert "osc" not in command


def test_tcp_selects_ucx_eager_sends_and_the_ring_allreduce_on_the_interface():
    command = _printed_command("--tcp=lo")
    for setting in ("OMPI_MCA_pml=ucx", "OMPI_MCA_osc=ucx", "OMPI_MCA_osc_ucx_tls=any", "UCX_TLS=tcp,self",
                    "UCX_RNDV_THRESH=inf", "OMPI_MCA_coll_tuned_allreduce_algorithm=4",
                    "UCX_NET_DEVICES=lo", "OMPI_MCA_btl_tcp_if_include=lo", "-x UCX_TLS -x UCX_RNDV_THRESH"):
        assert setting in command


TRAIN = LAUNCHER.parent / "train.sh"
RANK_ENV = LAUNCHER.parent / "rank_env.sh"


def _dry_run(*args: str) -> list[str]:
    result = subprocess.run(["bash", str(TRAIN), "--dry-run", *args], capture_output=True, text=True, timeout=60,
                            cwd=LAUNCHER.parents[1])
    assert result.returncode == 0, result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("+ ")]


def test_train_launcher_takes_the_rank_layout_from_the_config_and_places_ps_ranks_last():
    layout, command = _dry_run("--workers-on", "gpu1:4,gpu2:4", "--ps-on", "cpu1:2", "--tcp=eth0",
                               "configs/w1.yaml", "cluster.ps=2", "--resume")
    assert layout == "+ HYBRID_WORKERS=8 HYBRID_PS=2 HYBRID_RANKS=10 HYBRID_CHECKPOINT_DIR=checkpoints/w1"
    assert "mpirun.sh --tcp=eth0 -n 10 -H gpu1:4\\,gpu2:4\\,cpu1:2 --map-by slot -x HYBRID_WORKERS" in command
    assert command.endswith("rank_env.sh python -m hybrid train configs/w1.yaml cluster.ps=2 --resume ")


def test_train_launcher_with_horovodrun_prints_its_exact_command():
    _, command = _dry_run("--horovodrun", "configs/w1-smoke.yaml")
    assert command.startswith("+ horovodrun -np 4 -H localhost:4 --mpi-args=--allow-run-as-root\\ --oversubscribe")


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
