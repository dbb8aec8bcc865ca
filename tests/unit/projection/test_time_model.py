"""The time model's stage formulas against hand-computed cases, and what must hold whatever the inputs."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid.projection.time_model import (Cluster, Load, Profile, barrier_rounds_ms, bounding_stage, cpu_share,
                                          exchange_bytes, iteration_ms, ring_bytes, stage_ms)

PROFILE = Profile(op_ms=0.02, row_ms=0.0001, sample_ms=0.05, compute_ms=0.3, data_sample_ms=0.001,
                  allreduce_ms=0.1, barrier_ms=0.04, other_ms=0.2)


def test_a_gigabyte_over_8_gbit_takes_a_second_and_nothing_without_a_link():
    load = Load(samples=0, row_bytes=1000, push_rows=1e6, ps_push_rows=1e6)  # 1 GB written
    free = Profile(op_ms=0.0, row_ms=0.0, sample_ms=0.0)
    assert stage_ms(load, Cluster(workers=1, ps=1, gbps=8.0), free)["push"] == pytest.approx(1000.0)
    assert stage_ms(load, Cluster(workers=1, ps=1), free)["push"] == 0.0


def test_one_host_pays_the_operations_and_its_shared_cores_not_bytes():
    cluster = Cluster(workers=3, ps=1, workers_per_host=3, cores_per_host=2)
    load = Load(samples=128, pull_rows=1000, push_rows=800, row_bytes=72, pull_ops=2, push_ops=3,
                ps_pull_rows=3000, ps_push_rows=2400)
    profile = Profile(**{**PROFILE.__dict__, "schedule_ms": ((3, 1.0),)})
    stages = stage_ms(load, cluster, profile)
    share = 1.5  # 3 busy workers on 2 cores; the PS rank serves one-sided operations without its CPU
    assert cpu_share(cluster, profile) == share
    assert stages["compute"] == pytest.approx((0.3 + 128 * 0.05) * share)
    assert stages["pull"] == pytest.approx((2 * 0.02 + 1000 * 0.0001) * share)
    assert stages["push"] == pytest.approx((3 * 0.02 + 800 * 0.0001) * share)
    assert stages["data"] == pytest.approx(0.128 * share)
    assert stages["allreduce"] == pytest.approx(0.1 * share)
    assert (stages["barrier"], stages["other"]) == pytest.approx((0.04 * share, 0.2 * share))
    assert stages["schedule"] == pytest.approx(1.0 * share)  # each CPU worker makes every plan on its cores
    assert stages["schedule_wait"] == 0.0
    assert iteration_ms(load, cluster, profile) == pytest.approx(sum(stages.values()))


def test_the_measured_share_of_cores_replaces_processes_over_cores():
    measured = Profile(op_ms=0, row_ms=0, sample_ms=0, shares=((2, 1.1), (4, 2.6)))
    assert measured.share_at(1, 2) == 1.0
    assert measured.share_at(3, 2) == pytest.approx(1.85)
    assert measured.share_at(6, 2) == pytest.approx(4.1)  # along the last segment
    assert Profile(op_ms=0, row_ms=0, sample_ms=0).share_at(6, 2) == 3.0
    emulated = Cluster(workers=3, ps=1, gbps=1.0, cores_per_host=2, one_machine=True)
    assert emulated.busy_ranks == 4  # hosts emulated on one machine: the PS serving messages shares it too
    # ... in the pull and push stages; while the workers compute it has nothing to serve
    assert cpu_share(emulated, measured) == pytest.approx(2.6)
    assert emulated.computing_ranks == 3 and cpu_share(emulated, measured, emulated.computing_ranks) == pytest.approx(1.85)
    costs = Profile(op_ms=0, row_ms=0, sample_ms=0.1, data_sample_ms=0.1, shares=measured.shares)
    stages = stage_ms(Load(samples=10, row_bytes=72), emulated, costs)
    assert (stages["compute"], stages["data"]) == pytest.approx((1.0 * 1.85, 1.0 * 2.6))
    assert Cluster(workers=8, ps=2, workers_per_host=4, gbps=10.0).busy_ranks == 4
    assert cpu_share(Cluster(workers=8, ps=2, gbps=10.0), measured) == 1.0  # GPU workers


def test_a_stage_over_links_takes_the_busier_nic_and_a_round_trip():
    cluster = Cluster(workers=4, ps=1, workers_per_host=2, gbps=10.0, latency_ms=0.05)
    load = Load(samples=128, pull_rows=1000, row_bytes=72, pull_ops=1, ps_pull_rows=4000)
    # a worker host: 2 workers x 1000 rows x 72 B = 144 kB -> 0.1152 ms; the PS: 4000 x 72 B -> 0.2304 ms,
    # and a round trip of 0.1 ms
    stages = stage_ms(load, cluster, PROFILE)  # GPU workers (no cores given): the CPU costs unscaled
    assert stages["pull"] == pytest.approx(0.02 + 1000 * 0.0001 + 0.2304 + 0.1)
    # a PS that takes little: the worker hosts' NICs bound it
    light = Load(samples=128, pull_rows=1000, row_bytes=72, pull_ops=1, ps_pull_rows=100)
    assert stage_ms(light, cluster, PROFILE)["pull"] == pytest.approx(0.02 + 1000 * 0.0001 + 0.1152 + 0.1)
    none = Load(samples=128, row_bytes=72, pull_ops=1)  # nothing moves: no round trip
    assert stage_ms(none, cluster, PROFILE)["pull"] == pytest.approx(0.02)
    # write-backs go the other way at the same time: the slower direction counts
    both = Load(samples=128, pull_rows=1000, writeback_rows=500, row_bytes=72, pull_ops=2, ps_pull_rows=4000,
                ps_writeback_rows=6000)
    assert stage_ms(both, cluster, PROFILE)["pull"] == pytest.approx(2 * 0.02 + 1500 * 0.0001 + 0.3456 + 0.1)


def test_a_version_check_moves_16_bytes_not_a_row():
    cluster = Cluster(workers=1, ps=1, gbps=1.0)
    load = Load(samples=0, row_bytes=1000, check_rows=1000, ps_check_rows=1000)
    # 16 kB over 1 Gbit/s: 0.128 ms
    assert stage_ms(load, cluster, Profile(op_ms=0, row_ms=0, sample_ms=0))["pull"] == pytest.approx(0.128)


def test_the_ring_allreduce_moves_2_h_minus_1_over_h_of_the_bytes_between_hosts():
    load = Load(samples=1, row_bytes=72, mlp_bytes=1e6)
    apart = Cluster(workers=8, ps=1, workers_per_host=2, gbps=10.0, latency_ms=0.05)
    # 4 hosts: 1.5 MB through each NIC (1.2 ms at 10 Gbit/s), 6 steps of 0.05 ms
    assert ring_bytes(load, apart) == pytest.approx(1.5e6)
    assert stage_ms(load, apart, PROFILE)["allreduce"] == pytest.approx(0.1 + 1.2 + 0.3)
    assert ring_bytes(load, Cluster(workers=8, ps=1, workers_per_host=8, gbps=10.0)) == 0.0
    assert ring_bytes(load, Cluster(workers=1, ps=1, gbps=10.0)) == 0.0


def test_the_patient_sum_between_hosts_sends_two_exchanges_or_waits_as_measured():
    # 3 workers, one per host, sharing 2 cores: the runtime's reduce-scatter (Alltoall) and allgather each send
    # (h - 1) / h of the MLP's bytes through each NIC both ways, 2 (h - 1) / h in all, as a ring does
    measured = Profile(**{**PROFILE.__dict__, "collectives": ((3, 5.0, 0.5),)})
    cluster = Cluster(workers=3, ps=1, workers_per_host=1, gbps=1.0, cores_per_host=2, one_machine=True)
    load = Load(samples=1, row_bytes=72, mlp_bytes=3e6)
    assert cluster.patient and exchange_bytes(load, cluster) == pytest.approx(2e6)
    assert 2 * exchange_bytes(load, cluster) == pytest.approx(ring_bytes(load, cluster))
    share = cpu_share(cluster, measured)
    stages = stage_ms(load, cluster, measured)
    # 4 MB each way at 125 kB per ms (the emulated bucket's first 256 KiB at once): about 30 ms, which outlasts
    # the 5 ms the probe waited unshaped
    assert 28.0 < stages["allreduce"] - 0.1 * share < 34.0
    small = Load(samples=1, row_bytes=72, mlp_bytes=1e5)  # about 1 ms of bytes: the probe's 5 ms stands
    assert stage_ms(small, cluster, measured)["allreduce"] == pytest.approx(0.1 * share + 5.0)


def test_each_exchange_of_the_patient_sum_leaves_at_once_and_rides_what_is_left_of_the_bucket():
    # 300 kB of gradients among 3 hosts: 200 kB each way per exchange; after 10 ms of compute the 256 KiB buckets
    # are full, the Alltoall passes at once, the Allgather has 62,144 B of bucket left: 137,856 B at 125 kB per ms
    # (Horovod's ring, whose chunks follow each other, takes 2.4 ms: test_an_emulated_link_s_bucket_...)
    bucket = Cluster(workers=3, ps=1, gbps=1.0, burst_bytes=262_144, cores_per_host=2, one_machine=True)
    profile = Profile(op_ms=0.0, row_ms=0.0, sample_ms=0.1 / 2)  # 10 ms of compute at a share of 2 (4 ranks)
    load = Load(samples=100, row_bytes=72, mlp_bytes=300_000)
    assert stage_ms(load, bucket, profile)["allreduce"] == pytest.approx((200_000 - 62_144) / 125_000)
    # two workers a host, 8 workers: each worker sends 6 of its 8 chunks off its host, 2 x 6 / 8 of the bytes
    assert exchange_bytes(Load(samples=1, row_bytes=72, mlp_bytes=1e6),
                          Cluster(workers=8, ps=1, workers_per_host=2, gbps=1.0)) == pytest.approx(1.5e6)


def test_the_scheduler_s_cpu_work_hides_while_the_sum_s_bytes_are_on_the_links():
    # CPU workers make each plan in their allreduce's wait; while every rank waits for the links the cores are free
    cluster = Cluster(workers=3, ps=1, workers_per_host=1, gbps=1.0, cores_per_host=2, one_machine=True)
    profile = Profile(op_ms=0.0, row_ms=0.0, sample_ms=0.0, schedule_ms=((3, 5.0),))  # 10 ms at a share of 2
    short = Load(samples=1, row_bytes=72, mlp_bytes=300_000)  # 200 kB per exchange: 1.6 + 1.6 ms of bytes
    assert stage_ms(short, cluster, profile)["schedule"] == pytest.approx(10.0 - 3.2)
    long = Load(samples=1, row_bytes=72, mlp_bytes=3e6)  # 32 ms of bytes: the plans are made meanwhile
    assert stage_ms(long, cluster, profile)["schedule"] == 0.0


def test_the_ps_host_takes_the_writes_from_the_first_worker_done_with_its_updates():
    # 3 workers sharing 2 cores (4 ranks: a share of 2); each updates and packs its 100 rows in 1 ms alone, 2 ms
    # shared. The PS host's NIC takes the 300 kB of all three from 1 ms on (2.4 ms at 1 Gbit/s): 3.4 ms; the
    # busiest worker's own 100 kB leave at 2 ms (0.8 ms): 2.8 ms
    cluster = Cluster(workers=3, ps=1, workers_per_host=1, gbps=1.0, cores_per_host=2, one_machine=True)
    profile = Profile(op_ms=0.0, row_ms=0.01, sample_ms=0.0)
    load = Load(samples=1, row_bytes=1000, push_rows=100, ps_push_rows=300)
    assert stage_ms(load, cluster, profile)["push"] == pytest.approx(1.0 + 2.4)
    light = Load(**{**load.__dict__, "ps_push_rows": 30})  # 30 kB at the PS: the busiest worker's bytes bound it
    assert stage_ms(light, cluster, profile)["push"] == pytest.approx(2.0 + 0.8)
    no_bytes = Load(**{**load.__dict__, "ps_push_rows": 0, "push_rows": 0, "update_rows": 100})
    assert stage_ms(no_bytes, cluster, Profile(op_ms=0.0, row_ms=0.0, sample_ms=0.0, update_row_ms=0.01))["push"] \
        == pytest.approx(2.0)  # updates in the cache only: the CPU work at the cores' share


def test_the_barrier_pays_a_round_trip_per_doubling_of_the_workers_between_hosts():
    assert barrier_rounds_ms(Cluster(workers=8, ps=1, gbps=1.0, latency_ms=0.1)) == pytest.approx(0.6)
    assert barrier_rounds_ms(Cluster(workers=8, ps=1, workers_per_host=8, gbps=1.0, latency_ms=0.1)) == 0.0
    assert barrier_rounds_ms(Cluster(workers=1, ps=1, gbps=1.0, latency_ms=0.1)) == 0.0


def test_the_prefetch_shows_only_where_it_outlasts_compute_the_allreduce_and_the_next_batch_s_data():
    cluster = Cluster(workers=1, ps=1, gbps=1.0)
    # 10,000 rows of 100 B = 8 ms over 1 Gbit/s, waited for at the end of push (the loop's flush)
    load = Load(samples=10, row_bytes=100, prefetch_rows=10000, ps_prefetch_rows=10000)
    slow = Profile(op_ms=0.0, row_ms=0.0, sample_ms=1.0)  # compute 10 ms: hidden
    assert stage_ms(load, cluster, slow)["push"] == pytest.approx(0.0)
    fast = Profile(op_ms=0.0, row_ms=0.0, sample_ms=0.5)  # compute 5 ms: 3 ms show
    stages = stage_ms(load, cluster, fast)
    assert (stages["pull"], stages["push"]) == pytest.approx((0.0, 3.0))
    fed = Profile(op_ms=0.0, row_ms=0.0, sample_ms=0.5, data_sample_ms=0.1)  # and 1 ms of data: 2 ms show
    assert stage_ms(load, cluster, fed)["push"] == pytest.approx(2.0)


def test_the_writes_show_only_where_they_outlast_the_next_batch_s_data():
    cluster = Cluster(workers=1, ps=1, gbps=1.0)
    load = Load(samples=1000, push_rows=10000, row_bytes=100, ps_push_rows=10000)  # 8 ms of bytes
    profile = Profile(op_ms=0.0, row_ms=0.0, sample_ms=0.0, data_sample_ms=0.005)  # data 5 ms
    assert stage_ms(load, cluster, profile)["push"] == pytest.approx(3.0)


def test_a_gpu_worker_s_scheduler_slower_than_the_iteration_sets_the_pace():
    cluster = Cluster(workers=8, ps=1, workers_per_host=8)
    load = Load(samples=10, row_bytes=72)
    profile = Profile(op_ms=0.0, row_ms=0.0, sample_ms=0.1, schedule_ms=((8, 50.0),))
    stages = stage_ms(load, cluster, profile)
    assert iteration_ms(load, cluster, profile) == pytest.approx(50.0)
    assert bounding_stage(stages) == "schedule"
    assert bounding_stage(stage_ms(load, cluster, Profile(op_ms=0.0, row_ms=0.0, sample_ms=0.1))) == "compute"


def test_the_scheduler_s_time_is_interpolated_between_worker_counts_and_extended_beyond():
    profile = Profile(op_ms=0, row_ms=0, sample_ms=0, schedule_ms=((3, 1.1), (1, 0.5)))
    assert profile.schedule_at(1) == pytest.approx(0.5)
    assert profile.schedule_at(2) == pytest.approx(0.8)
    assert profile.schedule_at(5) == pytest.approx(1.7)
    assert Profile(op_ms=0, row_ms=0, sample_ms=0).schedule_at(64) == 0.0


@pytest.mark.parametrize("bad", [dict(workers=0), dict(ps=0), dict(gbps=0.0), dict(latency_ms=-1.0),
                                 dict(cores_per_host=0)])
def test_a_cluster_that_cannot_exist_is_refused(bad):
    with pytest.raises(ValueError):
        Cluster(**{"workers": 2, "ps": 1, **bad})


def test_a_negative_cost_is_refused_naming_it():
    with pytest.raises(ValueError, match="row_ms"):
        Profile(op_ms=0.0, row_ms=-1.0, sample_ms=0.0)


rows = st.floats(min_value=0, max_value=1e6)


@settings(max_examples=200, deadline=None)
@given(pull=rows, push=rows, prefetch=rows, more=st.floats(min_value=0, max_value=1e5),
       gbps=st.floats(min_value=0.1, max_value=400), faster=st.floats(min_value=1.0, max_value=10.0),
       workers=st.integers(1, 1024), per_host=st.integers(1, 16))
def test_more_rows_never_take_less_time_and_a_faster_link_never_more(pull, push, prefetch, more, gbps, faster,
                                                                    workers, per_host):
    cluster = Cluster(workers=workers, ps=4, workers_per_host=per_host, gbps=gbps, latency_ms=0.01)
    load = Load(samples=128, pull_rows=pull, push_rows=push, row_bytes=72, prefetch_rows=prefetch,
                writeback_rows=push / 2, check_rows=pull / 3, p2p_rows=pull / 5, pull_ops=4, push_ops=8,
                ps_pull_rows=pull * workers / 4, ps_prefetch_rows=prefetch * workers / 4,
                ps_push_rows=push * workers / 4, ps_writeback_rows=push * workers / 8, mlp_bytes=4e6)
    base = iteration_ms(load, cluster, PROFILE)
    for field in ("pull_rows", "writeback_rows", "check_rows", "p2p_rows", "push_rows", "prefetch_rows",
                  "ps_pull_rows", "ps_writeback_rows", "ps_check_rows", "ps_prefetch_rows", "ps_push_rows",
                  "pull_ops", "push_ops", "samples", "mlp_bytes"):
        grown = Load(**{**load.__dict__, field: getattr(load, field) + more})
        assert iteration_ms(grown, cluster, PROFILE) >= base * (1 - 1e-12) - 1e-9  # the clock's float rounding
    quicker = Cluster(workers=workers, ps=4, workers_per_host=per_host, gbps=gbps * faster, latency_ms=0.01)
    assert iteration_ms(load, quicker, PROFILE) <= base * (1 + 1e-12) + 1e-9


def test_a_slower_machine_scales_every_cpu_cost_but_not_the_shares():
    profile = Profile(op_ms=0.1, row_ms=0.001, sample_ms=0.05, compute_ms=2.0, schedule_ms=((3, 1.0),),
                      shares=((2, 1.3),))
    slow = profile.slower(1.5)
    assert (slow.op_ms, slow.row_ms, slow.sample_ms, slow.compute_ms) == pytest.approx((0.15, 0.0015, 0.075, 3.0))
    assert slow.schedule_ms == ((3, 1.5),) and slow.shares == ((2, 1.3),)
    assert profile.floor_ms(128) == pytest.approx(2.0 + 6.4)


def test_workers_sharing_cores_pay_the_measured_patient_collectives():
    measured = Profile(**{**PROFILE.__dict__, "collectives": ((2, 0.7, 0.55), (4, 1.0, 0.8))})
    load = Load(samples=128, row_bytes=72)
    crowded = Cluster(workers=3, ps=1, workers_per_host=3, cores_per_host=2)  # 4 ranks on 2 cores
    roomy = Cluster(workers=3, ps=1, workers_per_host=3, cores_per_host=8)
    assert crowded.patient and not roomy.patient
    assert not Cluster(workers=3, ps=1, workers_per_host=3).patient  # GPU workers: compute off the cores
    assert Cluster(workers=2, ps=1, workers_per_host=1, gbps=1.0, cores_per_host=2, one_machine=True).patient
    assert not Cluster(workers=4, ps=1, workers_per_host=2, gbps=1.0, cores_per_host=2).patient
    share = cpu_share(crowded, measured)
    stages, plain = stage_ms(load, crowded, measured), stage_ms(load, crowded, PROFILE)
    assert stages["allreduce"] == pytest.approx(0.1 * share + 0.85)  # halfway between 2 and 4 workers
    assert stages["barrier"] == pytest.approx(0.04 * share + 0.675)
    assert (plain["allreduce"], plain["barrier"]) == pytest.approx((0.1 * share, 0.04 * share))  # not measured
    one = Cluster(workers=1, ps=1, workers_per_host=1, cores_per_host=1)
    assert stage_ms(load, one, measured)["allreduce"] == pytest.approx(0.1)  # one worker waits for nobody


def test_fae_s_hot_sums_are_a_second_allreduce_and_its_held_out_loss_a_forward_pass_per_sample():
    cluster = Cluster(workers=3, ps=1, workers_per_host=1, gbps=10.0, latency_ms=0.05)
    plain = Load(samples=128, row_bytes=72, mlp_bytes=1e6)
    fae = Load(samples=128, row_bytes=72, mlp_bytes=1e6, hot_allreduces=0.5, hot_allreduce_bytes=3e5, eval_samples=30)
    # 3 hosts: (1 MB + 0.3 MB) x 4/3 through each NIC at 10 Gbit/s, 4 steps of 0.05 ms for 1.5 rings
    assert ring_bytes(fae, cluster) == pytest.approx(1.3e6 * 4 / 3)
    stages, before = stage_ms(fae, cluster, PROFILE), stage_ms(plain, cluster, PROFILE)
    assert stages["allreduce"] == pytest.approx(1.5 * 0.1 + 1.3e6 * 4 / 3 * 8 / 10e9 * 1e3 + 1.5 * 4 * 0.05)
    assert stages["pull"] - before["pull"] == pytest.approx(30 * 0.05 / 3)  # a third of a sample's compute


def test_an_emulated_link_s_bucket_passes_its_first_bytes_at_once():
    # 1 Gbit/s: 125 kB per ms; 256 KiB pass at once after a pause (here 10 ms of compute), per NIC and direction
    bucket = Cluster(workers=3, ps=1, gbps=1.0, burst_bytes=262_144)
    idle = Profile(op_ms=0.0, row_ms=0.0, sample_ms=0.1)
    # the PS host's NIC sends 3 x 400 kB, less one bucket; a worker's host its 400 kB, less one
    reads = Load(samples=100, row_bytes=1000, pull_rows=400, ps_pull_rows=1200)
    assert stage_ms(reads, bucket, idle)["pull"] == pytest.approx((1_200_000 - 262_144) / 125_000)
    small = Load(samples=100, row_bytes=1000, pull_rows=20, ps_pull_rows=60)  # 60 kB: at once
    assert stage_ms(small, bucket, idle)["pull"] == 0.0
    # a ring's steps follow each other at once: only the first step's chunk (a third of 300 kB) rides it
    profile = Profile(op_ms=0.0, row_ms=0.0, sample_ms=0.1)  # 10 ms of compute refill the buckets
    load = Load(samples=100, row_bytes=72, mlp_bytes=300_000)
    assert stage_ms(load, bucket, profile)["allreduce"] == pytest.approx((4 / 3 * 300_000 - 100_000) * 8 / 1e6)
    with pytest.raises(ValueError, match="burst_bytes"):
        Cluster(workers=1, ps=1, burst_bytes=-1)


def test_a_bucket_refills_only_while_its_nic_idles():
    # 100 Mbit/s refills 12.5 kB per ms
    slow = Cluster(workers=3, ps=1, gbps=0.1, burst_bytes=262_144)
    profile = Profile(op_ms=0.0, row_ms=0.0, sample_ms=2.0 / 128)  # 2 ms of compute
    load = Load(samples=128, row_bytes=1000, push_rows=100, ps_push_rows=300)
    # the PS host receives 300 kB each iteration, idle 2 ms in between: 25 kB of it at once
    assert stage_ms(load, slow, profile)["push"] == pytest.approx((300_000 - 25_000) * 8 / 0.1e9 * 1e3)
    # reads from it after 30 ms of compute: the PS host's NIC sent nothing for longer than 21 ms, 256 KiB at once
    idle = Profile(op_ms=0.0, row_ms=0.0, sample_ms=30.0 / 128)
    reads = Load(samples=128, row_bytes=1000, pull_rows=100, ps_pull_rows=300)
    assert stage_ms(reads, slow, idle)["pull"] == pytest.approx((300_000 - 262_144) * 8 / 0.1e9 * 1e3)
    # the prefetch leaves it right after those reads: its bucket is spent, all 300 kB at the rate, and the
    # reads of the next iteration find it refilled only for the 6 ms left of the 30 ms of compute: 75 kB
    ahead = Load(**{**reads.__dict__, "prefetch_rows": 100, "ps_prefetch_rows": 300})
    after = stage_ms(ahead, slow, idle)
    assert after["push"] == pytest.approx(0.0)  # 24 ms of prefetch: within compute
    assert after["pull"] == pytest.approx((300_000 - 75_000) / 12_500)


def test_the_writes_leave_after_the_sum_and_take_the_ps_host_s_link_at_its_rate():
    profile = Profile(op_ms=0.0, row_ms=0.0, sample_ms=0.0)
    cluster = Cluster(workers=3, ps=1, workers_per_host=1, gbps=1.0, cores_per_host=2, one_machine=True)
    load = Load(samples=1, row_bytes=1000, mlp_bytes=1e6, push_rows=100, ps_push_rows=1000)
    heavier = Load(**{**load.__dict__, "ps_push_rows": 3000})  # 2 MB more into the PS host: 16 ms at 1 Gbit/s
    assert stage_ms(heavier, cluster, profile)["push"] - stage_ms(load, cluster, profile)["push"] == \
        pytest.approx(16.0)
