"""Device, allreduce and staging choices of a worker (hybrid.runtime.accelerator)."""
import numpy as np
import pytest
import torch

from hybrid.runtime.accelerator import (AcceleratorError, HostStagedOptimizer, Staging, choose_allreduce,
                                        pick_device)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")


def test_one_worker_sums_nothing_unless_a_sum_is_asked_for():
    """A run of one worker has nobody to sum with: no collective per iteration, except where one is asked
    for (launch/gpu_check.sh runs train.allreduce=horovod on one GPU worker on purpose)."""
    for identities in ([None], ["h1/GPU-a"]):
        alone = choose_allreduce("auto", identities, nccl_built=True, cpu_backend="mpi")
        assert not alone.summed and alone.describe() == "not summed: one worker"
    assert choose_allreduce("horovod", ["h1/GPU-a"], nccl_built=True, cpu_backend="mpi").summed
    assert choose_allreduce("mpi", [None], nccl_built=False, cpu_backend="mpi").by_mpi
    assert choose_allreduce("host", [None], nccl_built=False, cpu_backend="mpi").host_staged


def test_cpu_workers_use_horovod_on_the_host_unless_host_staging_is_asked_for():
    choice = choose_allreduce("auto", [None, None], nccl_built=False, cpu_backend="mpi")
    assert not choice.host_staged and choice.describe() == "Horovod mpi: CPU workers"
    assert choose_allreduce("host", [None, None], nccl_built=True, cpu_backend="gloo").host_staged


def test_cpu_workers_sum_by_mpi_where_every_workers_mpich_waits_yield_or_where_asked():
    """MPICH ranks that share cores: Horovod's coordination cycle would pace each iteration (docs/cluster.md)."""
    choice = choose_allreduce("auto", [None, None, None], nccl_built=False, cpu_backend="mpi",
                              mpich_yields=[True, True, True])
    assert choice.by_mpi and choice.host_staged and choice.describe().startswith("MPI reduce-scatter and allgather of one host buffer")
    for yields in ([True, False, True], [False] * 3, None):  # any worker that spins: all take Horovod alike
        assert not choose_allreduce("auto", [None] * 3, nccl_built=False, cpu_backend="mpi",
                                    mpich_yields=yields).by_mpi
    assert not choose_allreduce("horovod", [None] * 2, nccl_built=False, cpu_backend="mpi",
                                mpich_yields=[True, True]).by_mpi
    assert choose_allreduce("mpi", [None] * 2, nccl_built=False, cpu_backend="mpi").by_mpi
    gpus = choose_allreduce("auto", ["h1/GPU-a", "h1/GPU-b"], nccl_built=True, cpu_backend="mpi",
                            mpich_yields=[True, True])
    assert gpus.backend == "nccl" and not gpus.by_mpi


@pytest.mark.parametrize("identities", [[None, None], ["h1/GPU-a", "h1/GPU-b"], ["h1/GPU-a", "h1/GPU-a"]])
def test_workers_without_horovod_sum_by_mpi_whatever_their_devices(identities):
    """comm.worker_collectives found a worker that cannot import Horovod: NCCL and Horovod's host sum are out."""
    why = "Horovod is not installed (worker(s) 1)"
    choice = choose_allreduce("auto", identities, nccl_built=False, cpu_backend="mpi", without_horovod=why)
    assert choice.by_mpi and choice.host_staged
    assert choice.describe() == f"MPI reduce-scatter and allgather of one host buffer on the workers' communicator: {why}"


def test_one_gpu_per_worker_with_nccl_uses_nccl():
    choice = choose_allreduce("auto", ["h1/GPU-a", "h1/GPU-b", "h2/GPU-a"], nccl_built=True, cpu_backend="mpi")
    assert not choice.host_staged and choice.backend == "nccl"


@pytest.mark.parametrize("identities,nccl,why", [
    (["h1/GPU-a", "h1/GPU-a", "h1/GPU-b"], True, "3 workers on 2 GPU(s)"),
    (["h1/GPU-a", "h1/GPU-b"], False, "without NCCL"),
])
def test_workers_sharing_a_gpu_or_a_horovod_without_nccl_fall_back_to_the_host_staged_sum(identities, nccl, why):
    choice = choose_allreduce("auto", identities, nccl_built=nccl, cpu_backend="mpi")
    assert choice.host_staged and why in choice.describe()
    with pytest.raises(AcceleratorError, match="train.allreduce=auto"):
        choose_allreduce("horovod", identities, nccl_built=nccl, cpu_backend="mpi")


@pytest.mark.parametrize("identities", [[None, None], ["h1/GPU-a", "h1/GPU-b"]])
def test_a_16_bit_wire_sums_by_mpi_in_worker_order_on_cpus_and_gpus(identities):
    """cluster.wire_precision=bf16: only MPI's reduce-scatter and allgather give a sum defined to the bit."""
    for wanted in ("auto", "host", "mpi"):
        choice = choose_allreduce(wanted, identities, nccl_built=True, cpu_backend="mpi", sixteen_bit_wire=True)
        assert choice.by_mpi and choice.host_staged and choice.sixteen_bit
        assert "bfloat16 on the wire" in choice.describe()
    with pytest.raises(AcceleratorError, match="train.allreduce=horovod cannot send the MLP gradients in 16 bits"):
        choose_allreduce("horovod", identities, nccl_built=True, cpu_backend="mpi", sixteen_bit_wire=True)
    alone = choose_allreduce("auto", identities[:1], nccl_built=True, cpu_backend="mpi", sixteen_bit_wire=True)
    assert not alone.summed


def test_bad_settings_are_refused_naming_the_key():
    with pytest.raises(AcceleratorError, match="train.allreduce"):
        choose_allreduce("nccl", [None], nccl_built=True, cpu_backend="mpi")
    with pytest.raises(AcceleratorError, match="some workers have a GPU"):
        choose_allreduce("auto", ["h1/GPU-a", None], nccl_built=True, cpu_backend="mpi")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA")
def test_asking_for_cuda_without_it_says_what_to_do():
    assert pick_device("auto", 0) == torch.device("cpu")
    with pytest.raises(AcceleratorError, match="train.device=cpu"):
        pick_device("cuda", 0)


class _TwoIdenticalWorkers:
    """Horovod as two workers with the same gradients: the sum doubles them."""
    Sum = "sum"

    def __init__(self):
        self.calls = []

    def allreduce_(self, tensor, op, name):
        self.calls.append((tensor.shape, op, name))
        tensor.mul_(2)
        return tensor


@pytest.mark.parametrize("synchronized", [True, False])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_the_host_staged_step_applies_the_summed_gradients_in_one_buffer(device, synchronized):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)).double().to(device)
    twin = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)).double().to(device)
    twin.load_state_dict(model.state_dict())
    x = torch.randn(5, 3, dtype=torch.float64, device=device)
    hvd = _TwoIdenticalWorkers()
    staged = HostStagedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), hvd, list(model.parameters()))
    plain = torch.optim.SGD(twin.parameters(), lr=0.1)
    for net, optimizer in ((model, staged), (twin, plain)):
        optimizer.zero_grad()
        net(x).sum().backward()
    for p in twin.parameters():
        p.grad.mul_(2)
    if synchronized:
        staged.synchronize()  # the loop's allreduce stage; then its step, which must not sum again
    staged.step()
    plain.step()
    assert hvd.calls == [((sum(p.numel() for p in model.parameters()),), "sum", "host_staged_gradients")]
    for got, want in zip(model.parameters(), twin.parameters()):
        assert torch.equal(got, want)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_staging_carries_arrays_to_the_device_and_gradients_back_unchanged(device):
    staging = Staging(torch.device(device))
    rows = np.random.default_rng(1).normal(size=(7, 4))
    on_device = staging.to_device(rows[[3, 1, 3]]).requires_grad_(True)
    assert on_device.device.type == device
    (on_device * torch.arange(3.0, dtype=torch.float64, device=device)[:, None]).sum().backward()
    assert np.array_equal(staging.to_host(on_device.grad), np.repeat(np.arange(3.0)[:, None], 4, axis=1))
    assert staging.to_device(np.arange(4), torch.float32).dtype == torch.float32


def test_the_host_staged_gradients_are_views_of_one_buffer_that_backward_fills_in_place():
    """No per-parameter copies per iteration: backward writes into the flat buffer the sum runs on (CPU)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)).double()
    hvd = _TwoIdenticalWorkers()
    staged = HostStagedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), hvd, list(model.parameters()))
    for _ in range(2):
        staged.zero_grad()
        model(torch.randn(5, 3, dtype=torch.float64)).sum().backward()
        assert all(p.grad is view for p, view in zip(model.parameters(), staged.views))
        expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()]) * 2
        staged.synchronize()
        assert staged.host is staged.flat and torch.equal(staged.flat, expected)
        staged.step()
    model[0].weight.grad = torch.ones_like(model[0].weight)  # a gradient set elsewhere is taken in
    staged.zero_grad()
    assert model[0].weight.grad is staged.views[0] and not staged.flat.any()
