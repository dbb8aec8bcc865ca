"""Workload configs load; overrides apply; bad values fail naming the key."""
from pathlib import Path

import pytest

from hybrid.config import ConfigError, Mode, ModelName, load_config

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))
PAPER_WORKLOADS = {"w1": ModelName.wide_deep, "w2": ModelName.ncf, "w3": ModelName.deepfm, "w4": ModelName.dcn,
                   "ml100k": ModelName.ncf}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_loads(path):
    config = load_config(path)
    assert config.name == path.stem
    assert config.model.name == PAPER_WORKLOADS[path.stem.split("-")[0]]


@pytest.mark.parametrize("name", ["w1", "w2", "w3", "w4"])
def test_paper_defaults(name):
    config = load_config(Path(__file__).parents[2] / "configs" / f"{name}.yaml")
    assert (config.cluster.workers, config.cluster.ps) == (8, 1)
    assert config.cache.ratio == 0.1 and config.cache.policy.value == "lru"
    assert config.train.batch_per_worker == 128
    assert config.global_batch == 1024


def test_smoke_configs_are_synthetic_and_small():
    for path in CONFIGS:
        if path.stem.endswith("smoke"):
            config = load_config(path)
            assert config.data.synthetic is not None
            assert config.cluster.workers == 3


def test_overrides_apply_with_types():
    config = load_config(CONFIGS[0], ["cluster.workers=4", "scheduler.mode=vanilla", "cache.ratio=0.25",
                                      "model.top_mlp=[8,4]"])
    assert config.cluster.workers == 4
    assert config.scheduler.mode is Mode.vanilla
    assert config.cache.ratio == 0.25
    assert config.model.top_mlp == [8, 4]


def test_an_empty_override_is_an_empty_value():
    plain = load_config(CONFIGS[0], ["cluster.shard_plan=plans/x.json"])
    assert load_config(CONFIGS[0], ["cluster.shard_plan="]).cluster.shard_plan == "" != plain.cluster.shard_plan


def test_loads_never_see_one_another(tmp_path):
    """The schema and a file's merged text are built once per process (hybrid/config.py): no load may
    change what a later one returns, and a file rewritten between loads is read anew."""
    defaults = load_config()
    assert load_config(None, ["cluster.workers=3", "model.top_mlp=[8,4]"]).cluster.workers == 3
    first = load_config(CONFIGS[0])
    first.model.top_mlp.append(99)
    first.cluster.workers = 77
    assert load_config() == defaults
    assert load_config(CONFIGS[0]).model.top_mlp == load_config(CONFIGS[0], ["seed=1"]).model.top_mlp != \
        first.model.top_mlp
    path = tmp_path / "changing.yaml"
    for workers in (2, 5):
        path.write_text(f"cluster: {{workers: {workers}}}\n")
        assert load_config(path).cluster.workers == workers


def test_digest_depends_on_values():
    base = load_config(CONFIGS[0])
    assert base.digest() == load_config(CONFIGS[0]).digest()
    assert base.digest() != load_config(CONFIGS[0], ["seed=1"]).digest()


@pytest.mark.parametrize("override, names", [
    ("cluster.workerz=3", ["cluster.workerz", "workers"]),
    ("cluster.workers=abc", ["cluster.workers", "abc"]),
    ("scheduler.mode=fa-st", ["scheduler.mode", "a mode's name"]),
    ("cache.ratio=1.5", ["cache.ratio", "(0, 1]"]),
    ("cluster.ps=0", ["cluster.ps", ">= 1"]),
    ("data.test_fraction=1", ["data.test_fraction"]),
    ("data.synthetic.like=imagenet", ["data.synthetic.like", "criteo-kaggle"]),
    ("model.bottom_mlp=[4,0]", ["model.bottom_mlp"]),
    ("train.batch_per_worker", ["key=value"]),
    ("train.embedding_lr=inf", ["train.embedding_lr", "finite"]),
    ("train.dense_lr=nan", ["train.dense_lr", "finite"]),
    ("cluster.transport=shmem", ["cluster.transport", "packed"]),
    ("scheduler.blocks=0", ["scheduler.blocks", ">= 1"]),
    ("scheduler.block_size=0", ["scheduler.block_size", ">= 1"]),
])
def test_bad_values_name_the_key(override, names):
    smoke = next(p for p in CONFIGS if p.stem == "w1-smoke")
    with pytest.raises(ConfigError) as info:
        load_config(smoke, [override])
    for name in names:
        assert name in str(info.value)


def test_bad_yaml_file_names_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train: {lr_typo: 0.1}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: train.lr_typo"):
        load_config(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_smoke_caches_hold_a_working_set():
    """Every smoke workload can be simulated and trained with its own cache ratio."""
    from hybrid.data.synthetic import PROFILES, SyntheticGenerator
    from hybrid.scheduling.scheduler import cache_capacity

    for path in CONFIGS:
        if path.stem.endswith("smoke"):
            config = load_config(path)
            spec = config.data.synthetic
            cardinalities = SyntheticGenerator(PROFILES[spec.like], rows=1, scale=spec.scale).cardinalities
            cache_capacity(sum(cardinalities), config.cache.ratio, config.train.batch_per_worker,
                           len(cardinalities))  # every mode's allocation balances
