"""Emulated hosts: one Linux network namespace per rank, joined by shaped veth links (docs/design.md section 12).

Every rank of an MPI job gets its own namespace with one interface
(``eth0``) on a private bridge in the root namespace, so everything a rank
sends to another crosses two veth links, as it would cross two NICs and a
switch between hosts. Each link is shaped in both directions with ``tc``
(``tbf`` for bandwidth, ``netem`` under it for latency), so a rank's ingress
is capped as well as its egress: three workers pushing into one PS share its
link, as they would share its NIC.

The namespaces, links and addresses are created by :class:`EmulatedHosts`
and removed when its ``with`` block ends, on an exception, on Ctrl-C and on
SIGTERM (converted to an exception while the block runs). Launching uses
the launcher's remote-start hook, Open MPI's rsh agent or Hydra's ssh
launcher (MPICH's family, ``-launcher-exec``): a small script enters the
namespace of the host address the launcher gives it, with a per-namespace
``TMPDIR`` (the daemons share the hostname and ``/tmp``; without it some
Open MPI launches crashed writing hwloc's shared topology).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hybrid.runtime.mpi_family import of_venv

SUBNET = "10.201.{net}.0/24"
BURST_BYTES = 256 * 1024  # tbf's bucket up to 1 Gbit/s (LinkShape.burst_bytes)


class EmulationUnavailable(RuntimeError):
    """This machine cannot create namespaces and shaped links (not root, no ip/tc)."""


def check_available() -> None:
    """Raise :class:`EmulationUnavailable` saying why emulated hosts cannot be created here."""
    if os.geteuid() != 0:
        raise EmulationUnavailable("emulated hosts need root (network namespaces, veth links and tc); "
                                   "run as root or on a real cluster")
    launcher = of_venv().mpiexec
    missing = [tool for tool in ("ip", "tc", launcher) if shutil.which(tool) is None]
    if missing:
        raise EmulationUnavailable(f"emulated hosts need {', '.join(missing)} on PATH "
                                   f"(Debian: apt-get install iproute2, and the venv's MPI: launch/setup.sh)")


@dataclass(frozen=True)
class LinkShape:
    """What a link does to traffic: ``rate`` as tc writes it (``1gbit``, ``100mbit``) or None, delay in ms."""

    rate: Optional[str] = "1gbit"
    delay_ms: float = 0.0

    def label(self) -> str:
        return (self.rate or "unshaped") + (f"+{self.delay_ms:g}ms" if self.delay_ms else "")

    def burst_bytes(self) -> int:
        """tbf's bucket: 256 KiB, or 2 ms of traffic at the rate where that is more.

        At 10 Gbit/s a 256 KiB bucket empties in 0.2 ms, less than the
        kernel's timers can refill it in, and the link would run slower
        than asked; up to 1 Gbit/s the bucket stays 256 KiB.
        """
        bits_per_s = self.bits_per_s()
        return BURST_BYTES if bits_per_s is None else max(BURST_BYTES, int(bits_per_s / 8 * 0.002))

    def bits_per_s(self) -> Optional[float]:
        """The rate in bit/s where it is written as ``[k|m|g]bit`` (None: unshaped, or another tc unit)."""
        match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kmg]?)bit", (self.rate or "").lower())
        return None if match is None else float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode:
        raise EmulationUnavailable(f"`{' '.join(argv)}` failed: {result.stderr.strip()}")


class EmulatedHosts:
    """``n`` namespaces, host ``i`` at ``address(i)``; a context manager that always cleans up.

    ``net`` picks the /24 (10.201.net.0) and the names' suffix, so two
    benchmarks on one machine do not collide.
    """

    def __init__(self, n: int, shape: LinkShape = LinkShape(), *, net: int = 0):
        if not 1 <= n <= 200:
            raise ValueError(f"between 1 and 200 emulated hosts, got {n}")
        self.n, self.shape, self.net = n, shape, net
        self.hydra = of_venv().name == "mpich"  # launched by MPICH's Hydra, else by Open MPI's mpirun
        self.tag = f"h{net}"
        self.bridge = f"{self.tag}br"
        self.workdir: Optional[Path] = None
        self._created: list[tuple[str, str]] = []  # ("link"|"netns", name), undone in reverse
        self._previous_term = None

    # ---------------------------------------------------------------- names
    def namespace(self, i: int) -> str:
        return f"{self.tag}ns{i}"

    def link(self, i: int) -> str:
        """The root-namespace end of host ``i``'s veth: its counters are host ``i``'s traffic."""
        return f"{self.tag}v{i}"

    def address(self, i: int) -> str:
        return f"10.201.{self.net}.{11 + i}"

    @property
    def subnet(self) -> str:
        return SUBNET.format(net=self.net)

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "EmulatedHosts":
        check_available()
        self._previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"hybrid-{self.tag}-"))
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._created.append(("link", self.bridge))
        _run("ip", "addr", "add", f"10.201.{self.net}.1/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i in range(self.n):
            ns, outer, inner = self.namespace(i), self.link(i), f"{self.tag}p{i}"
            _run("ip", "netns", "add", ns)
            self._created.append(("netns", ns))
            _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            self._created.append(("link", outer))
            _run("ip", "link", "set", inner, "netns", ns)
            _run("ip", "link", "set", outer, "master", self.bridge)
            _run("ip", "link", "set", outer, "up")
            inside = ("ip", "netns", "exec", ns)
            _run(*inside, "ip", "link", "set", "lo", "up")
            _run(*inside, "ip", "link", "set", inner, "name", "eth0")
            _run(*inside, "ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _run(*inside, "ip", "link", "set", "eth0", "up")
            self._shape(inside, "eth0")  # what host i sends
            self._shape((), outer)  # what host i receives
        self._write_launch_files()

    def _shape(self, prefix: tuple, device: str) -> None:
        if self.shape.rate is None and not self.shape.delay_ms:
            return
        parent = ("root",)
        if self.shape.delay_ms:
            try:
                _run(*prefix, "tc", "qdisc", "add", "dev", device, "root", "handle", "1:", "netem",
                     "delay", f"{self.shape.delay_ms}ms", "limit", "100000")
            except EmulationUnavailable as err:
                raise EmulationUnavailable(f"added latency needs tc's netem, which this kernel lacks "
                                           f"(sch_netem); run without --latency-ms ({err})") from err
            parent = ("parent", "1:1")
        if self.shape.rate is not None:
            _run(*prefix, "tc", "qdisc", "add", "dev", device, *parent, "handle", "10:", "tbf",
                 "rate", self.shape.rate, "burst", str(self.shape.burst_bytes()), "latency", "50ms")

    def close(self) -> None:
        """Remove everything this object created, last first; safe to call twice."""
        while self._created:
            kind, name = self._created.pop()
            argv = ("ip", "netns", "del", name) if kind == "netns" else ("ip", "link", "del", name)
            subprocess.run(argv, capture_output=True)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        if self._previous_term is not None:
            signal.signal(signal.SIGTERM, self._previous_term)
            self._previous_term = None

    # ------------------------------------------------------------ launching
    def _write_launch_files(self) -> None:
        """A host file in the venv's MPI's format (one slot per host) and the agent that enters a namespace."""
        hostfile = self.workdir / "hostfile"
        line = "{}:1\n" if self.hydra else "{} slots=1\n"
        hostfile.write_text("".join(line.format(self.address(i)) for i in range(self.n)))
        cases = " ".join(f"{self.address(i)}) ns={self.namespace(i)} ;;" for i in range(self.n))
        agent = self.workdir / "rsh-agent"
        agent.write_text(
            "#!/bin/bash\n"
            "# Open MPI's rsh agent or Hydra's ssh launcher for emulated hosts: run the command inside the\n"
            "# host's namespace.\n"
            'while [[ "$1" == -* ]]; do shift; done\n'
            "host=$1; shift\n"
            f'case "$host" in {cases} *) echo "unknown emulated host $host" >&2; exit 255 ;; esac\n'
            f'mkdir -p "{self.workdir}/$ns"\n'
            f'exec ip netns exec "$ns" env TMPDIR="{self.workdir}/$ns" /bin/sh -c "$*"\n')
        agent.chmod(0o755)
        self.hostfile, self.agent = hostfile, agent

    def mpirun_args(self) -> list[str]:
        """Launcher options (the venv's MPI's) that put rank ``i`` on host ``i`` and keep MPI on the emulated links.

        The transport itself is what any TCP cluster needs: ``launch/mpirun.sh
        --tcp`` (UCX over TCP), here on each namespace's ``eth0``. Hydra's
        proxies call its control port back on the bridge's address
        (``-iface``): a namespace reaches nothing else.
        """
        if self.hydra:
            return ["-f", str(self.hostfile), "-launcher", "ssh", "-launcher-exec", str(self.agent),
                    "-iface", self.bridge, "-genv", "UCX_NET_DEVICES", "eth0"]
        return ["--hostfile", str(self.hostfile), "--mca", "plm_rsh_agent", str(self.agent),
                "--mca", "oob_tcp_if_include", self.subnet, "--mca", "btl_tcp_if_include", self.subnet,
                "-x", "UCX_NET_DEVICES=eth0"]

    # ------------------------------------------------------------- counters
    def counters(self) -> list[dict]:
        """Bytes host ``i`` has sent and received, read on the root-namespace end of its link."""
        result = []
        for i in range(self.n):
            stats = Path("/sys/class/net") / self.link(i) / "statistics"
            # The outer end receives what the host sends, and sends what it receives.
            result.append({"sent": int((stats / "rx_bytes").read_text()),
                           "received": int((stats / "tx_bytes").read_text())})
        return result


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
