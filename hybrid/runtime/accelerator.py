"""Where a worker computes, how its MLP gradients are summed, and how arrays cross to its GPU.

docs/training.md ("GPU") says how these are chosen; in short:

- The device: the worker's GPU (one per worker, by local rank; launch/rank_env.sh
  gives each worker one) when CUDA is present, else the CPU. PS ranks never
  compute: they serve rows from host memory, where RMA reads and writes them.
- The allreduce: Horovod's own (NCCL between GPUs, MPI or Gloo between CPUs),
  or *host-staged*: the gradients copied to host memory as one flat buffer,
  summed there by Horovod on the CPU, copied back. NCCL refuses two ranks on
  one GPU, and a Horovod built without NCCL cannot sum GPU tensors, so workers
  in either case get the host-staged sum, chosen by every worker alike from
  what all of them report. CPU workers under MPICH whose ranks share cores
  sum the host buffer with MPI on the workers' communicator instead of
  Horovod (``train.allreduce=mpi``): Horovod's coordination cycle would make
  every iteration wait for it (docs/cluster.md, "MPICH"). Workers without
  Horovod (``mpi``, or ``auto`` where it is not installed) sum the same way.
  A run of one worker has nothing to sum (``auto``): its optimizer steps
  alone, without a collective per iteration.
- The sum and the step are two calls (:class:`DenseOptimizer`): the loop
  times the sum as the allreduce and the step as compute, the model's own
  arithmetic, which a one-process trainer does too.
- Staging: the worker's cache lives in host memory (RMA writes into it), so
  each iteration's rows and inputs cross to the GPU and the rows' gradients
  come back. They go through pinned (page-locked) host memory, to the GPU on
  a side stream, so that the host does not wait for those copies; only the
  gradients' way back is waited for, because the host's PS updates need them.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

ALLREDUCES = ("auto", "horovod", "host", "mpi")


class AcceleratorError(ValueError):
    """A device or allreduce setting this worker cannot honour."""


def pick_device(wanted: str, local_rank: int) -> torch.device:
    """The worker's device for ``train.device``: auto (a GPU when CUDA is present), cpu or cuda."""
    available = torch.cuda.is_available()
    if wanted == "cuda" and not available:
        raise AcceleratorError("train.device=cuda, but this worker sees no CUDA device (a CPU build of PyTorch, "
                               "or CUDA_VISIBLE_DEVICES empty); on a GPU host run launch/setup.sh, which installs "
                               "a CUDA build there, or use train.device=cpu")
    if wanted == "cpu" or not available:
        return torch.device("cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def gpu_identity(device: torch.device) -> Optional[str]:
    """The physical GPU behind ``device`` as host/UUID (None on the CPU): equal on two ranks iff they share it."""
    if device.type != "cuda":
        return None
    return f"{socket.gethostname()}/{torch.cuda.get_device_properties(device).uuid}"


@dataclass(frozen=True)
class AllreduceChoice:
    """How the MLP gradients are summed, and why (the training summary prints both)."""

    host_staged: bool
    backend: str  # Horovod's backend for the sum: nccl, mpi or gloo
    reason: str
    by_mpi: bool = False  # the host buffer summed by MPI on the workers' communicator, not by Horovod
    summed: bool = True  # False: one worker, nothing to sum
    sixteen_bit: bool = False  # by MPI, 16 bits a value on the wire (MpiCollectives.allreduce_rounded_)

    def describe(self) -> str:
        if not self.summed:
            how = "not summed"
        elif self.sixteen_bit:
            how = ("MPI reduce-scatter (sums in worker order) and allgather of one host buffer, bfloat16 on the "
                   "wire (cluster.wire_precision)")
        elif self.by_mpi:
            how = "MPI reduce-scatter and allgather of one host buffer on the workers' communicator"
        elif self.host_staged:
            how = f"host-staged (Horovod {self.backend} on host copies)"
        else:
            how = f"Horovod {self.backend}"
        return f"{how}: {self.reason}"


def choose_allreduce(wanted: str, identities: list[Optional[str]], nccl_built: bool, cpu_backend: str,
                     mpich_yields: Optional[list[bool]] = None,
                     without_horovod: Optional[str] = None, sixteen_bit_wire: bool = False) -> AllreduceChoice:
    """The allreduce for ``train.allreduce`` given every worker's :func:`gpu_identity`.

    Every worker passes the same gathered lists, so every worker chooses
    alike (two choices would deadlock the sum). ``cpu_backend`` is the
    backend Horovod uses for host tensors (mpi or gloo). ``mpich_yields``:
    per worker, whether its MPICH waits yield because its host's ranks share
    cores (``hybrid._ext.mpi_yield``); where all do, CPU workers sum by MPI.
    ``without_horovod``: why the workers run without Horovod
    (hybrid.runtime.comm.worker_collectives), None where they loaded it;
    then they sum by MPI, through host memory. ``sixteen_bit_wire``: the
    gradients travel in 16 bits (``cluster.wire_precision``), which only
    MPI's rounded sum does (``MpiCollectives.allreduce_rounded_``), through
    host memory on GPUs too.
    """
    if wanted not in ALLREDUCES:
        raise AcceleratorError(f"train.allreduce: expected one of {', '.join(ALLREDUCES)}, got {wanted!r}")
    on_gpus = [i for i in identities if i is not None]
    if on_gpus and len(on_gpus) != len(identities):
        raise AcceleratorError("some workers have a GPU and some do not; give every worker a GPU, "
                               "or set train.device=cpu")
    if wanted == "auto" and len(identities) == 1:
        return AllreduceChoice(False, "none", "one worker", summed=False)
    if sixteen_bit_wire:
        if wanted == "horovod":
            raise AcceleratorError("train.allreduce=horovod cannot send the MLP gradients in 16 bits with a sum "
                                   "defined to the bit (Horovod's fp16 compression adds in 16 bits in the ring's "
                                   "order); use train.allreduce=auto or mpi with cluster.wire_precision=bf16 "
                                   "(docs/design.md section 14)")
        why = "asked for (train.allreduce=mpi)" if wanted == "mpi" else without_horovod or \
            "only MPI's rounded sum is defined to the bit"
        return AllreduceChoice(True, "mpi", why, by_mpi=True, sixteen_bit=True)
    if wanted == "mpi":
        return AllreduceChoice(True, "mpi", "asked for (train.allreduce=mpi)", by_mpi=True)
    if without_horovod is not None:
        return AllreduceChoice(True, "mpi", without_horovod, by_mpi=True)
    if not on_gpus:
        if wanted == "host":
            return AllreduceChoice(True, cpu_backend, "asked for (train.allreduce=host)")
        if wanted == "auto" and mpich_yields and all(mpich_yields):
            return AllreduceChoice(True, "mpi", "MPICH ranks share cores (Horovod's cycle would pace every "
                                                "iteration)", by_mpi=True)
        return AllreduceChoice(False, cpu_backend, "CPU workers")
    shared = len(set(on_gpus)) < len(on_gpus)
    if wanted == "horovod" and (shared or not nccl_built):
        raise AcceleratorError("train.allreduce=horovod needs one GPU per worker and a Horovod built with NCCL "
                               f"({'workers share a GPU' if shared else 'this Horovod has no NCCL'}); "
                               "use train.allreduce=auto")
    if wanted == "host":
        return AllreduceChoice(True, cpu_backend, "asked for (train.allreduce=host)")
    if shared:
        return AllreduceChoice(True, cpu_backend, f"{len(on_gpus)} workers on {len(set(on_gpus))} GPU(s): "
                                                  "NCCL needs one GPU per rank")
    if not nccl_built:
        return AllreduceChoice(True, cpu_backend, "this Horovod was built without NCCL")
    return AllreduceChoice(False, "nccl", "one GPU per worker")


class DenseOptimizer:
    """The MLP's optimizer, its gradients summed over the workers by :meth:`synchronize`, then :meth:`step`.

    Wraps ``optimizer`` alone (one worker: nothing to sum) or Horovod's
    ``DistributedOptimizer`` (its sum started by the backward pass, waited
    for by ``synchronize``). :class:`HostStagedOptimizer` sums through host
    memory. ``step`` sums first if ``synchronize`` was not called.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, horovod: bool = False):
        self.optimizer, self.horovod = optimizer, horovod
        self._summed = False

    @property
    def param_groups(self) -> list:
        """The wrapped optimizer's groups (their learning rates follow the run's schedule)."""
        return self.optimizer.param_groups

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def synchronize(self) -> None:
        """Sum the gradients over the workers (one worker: nothing to do)."""
        if self.horovod:
            self.optimizer.synchronize()
        self._summed = True

    def step(self) -> None:
        """Update the parameters from the summed gradients."""
        if not self._summed:
            self.synchronize()
        self._summed = False
        if self.horovod:
            with self.optimizer.skip_synchronize():
                self.optimizer.step()
        else:
            self.optimizer.step()

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)


class HostStagedOptimizer(DenseOptimizer):
    """An optimizer whose gradients are summed over the workers as one buffer in host memory.

    All gradients travel as one flat buffer in a fixed parameter order, so
    the sum (and its rounding) is the same on every worker and every run,
    like Horovod's single fusion group in deterministic runs. The parameters'
    gradients are views of one flat tensor on their device (as DDP's
    ``gradient_as_bucket_view``): backward accumulates into it in place,
    :meth:`zero_grad` is one fill, and on the CPU the sum runs on it directly;
    a GPU's is copied to pinned host memory and back, once each way.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, hvd, parameters: list[torch.nn.Parameter], wire=None):
        super().__init__(optimizer)
        self.hvd, self.parameters = hvd, parameters
        self.wire = wire  # a 16-bit wire: summed by hvd.allreduce_rounded_ (comm.MpiCollectives)
        numel = sum(p.numel() for p in parameters)
        device = parameters[0].device if parameters else torch.device("cpu")
        dtype = parameters[0].dtype if parameters else torch.float32
        self.flat = torch.zeros(numel, dtype=dtype, device=device)
        self.views, offset = [], 0
        for p in parameters:
            self.views.append(self.flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self._attach()
        self.host = self.flat if device.type == "cpu" else torch.empty(numel, dtype=dtype, pin_memory=True)

    def _attach(self) -> None:
        """Make every gradient its view of the flat buffer again (a gradient set elsewhere is copied in)."""
        for p, view in zip(self.parameters, self.views):
            if p.grad is not view:
                if p.grad is None:
                    view.zero_()
                else:
                    view.copy_(p.grad)
                p.grad = view

    def zero_grad(self) -> None:
        self._attach()
        self.flat.zero_()

    def synchronize(self) -> None:
        """Sum the flat gradient buffer over the workers (through pinned host memory from a GPU)."""
        self._attach()
        if self.host is not self.flat:
            self.host.copy_(self.flat, non_blocking=True)
            torch.cuda.current_stream(self.flat.device).synchronize()
        if self.wire is not None and self.wire.sixteen_bit:
            self.hvd.allreduce_rounded_(self.host, self.wire)
        else:
            self.hvd.allreduce_(self.host, op=self.hvd.Sum, name="host_staged_gradients")
        if self.host is not self.flat:
            self.flat.copy_(self.host, non_blocking=True)
        self._summed = True


class Staging:
    """Host arrays to the worker's device and back: pinned buffers and a copy stream on a GPU, views on the CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None

    def to_device(self, array: np.ndarray, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """``array`` as a tensor on the device; on a GPU the copy runs on the copy stream.

        The compute stream waits for the copy before any kernel that follows
        reads the tensor, and the tensor's memory is not reused before that
        stream is done with it; the host goes on at once.
        """
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if not self.cuda:
            return tensor if dtype is None else tensor.to(dtype)
        pinned = tensor.pin_memory()
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            out = pinned.to(self.device, dtype, non_blocking=True)
        compute.wait_stream(self.stream)
        out.record_stream(compute)
        return out

    def to_host(self, tensor: torch.Tensor) -> np.ndarray:
        """``tensor`` in host memory as an array, once its copy is complete (the host needs it next)."""
        tensor = tensor.detach()
        if not self.cuda:
            return tensor.numpy()
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return host.numpy()
