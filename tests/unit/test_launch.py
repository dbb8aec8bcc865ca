"""``launch/mpirun.sh``: prints what it runs; ``--tcp`` adds the transport a TCP cluster needs."""
import subprocess
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parents[2] / "launch" / "mpirun.sh"


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
