"""Typed run configuration: dataclasses loaded from YAML plus ``key=value`` overrides.

A config is built once (``load_config``) and passed down; no module reads
arguments or the environment on its own. OmegaConf does the merging and type
checking; ``validate`` adds the range and cross-field checks. Every error
names the offending key and what would be accepted.
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A config value is missing, unknown, of the wrong type or out of range."""


class Mode(str):
    """A mode's name, the value of ``scheduler.mode`` (docs/design.md section 7, docs/modes.md).

    The modes are the classes ``hybrid.modes`` registers, not a list kept
    here: a new mode is one module that registers itself. The config sits
    below the modes, so a name is checked when its mode is looked up
    (``hybrid.modes.get``, at start-up), and only its spelling here. Each
    name has one instance (``Mode("fae") is Mode.fae``); the built-in ones
    are attributes so code can name them.
    """

    _names: dict = {}

    def __new__(cls, name: str) -> "Mode":
        name = str(name)
        known = cls._names.get(name)
        if known is None:
            if not name.isidentifier():
                raise ValueError(f"a mode's name is a Python identifier, got {name!r}")
            known = cls._names[name] = super().__new__(cls, name)
        return known

    def __getnewargs__(self):
        return (str(self),)

    @property
    def value(self) -> str:
        """The name as plain text (what an enum's ``value`` gave, where a mode is printed)."""
        return str(self)


for _builtin in ("vanilla", "laia", "plan", "herald", "het", "fae"):
    setattr(Mode, _builtin, Mode(_builtin))


class ModelName(str, enum.Enum):
    wide_deep = "wide_deep"
    ncf = "ncf"
    deepfm = "deepfm"
    dcn = "dcn"
    dlrm = "dlrm"


class Precision(str, enum.Enum):
    float32 = "float32"
    float64 = "float64"


class CachePolicy(str, enum.Enum):
    lru = "lru"
    lfu = "lfu"


class LaiaOrder(str, enum.Enum):
    """The order LAIA takes samples in: ``arrival`` (the paper's) or ``confident`` (largest margin first)."""

    arrival = "arrival"
    confident = "confident"


class LaiaScoring(str, enum.Enum):
    """What LAIA maximizes per sample: ``fresh`` rows on the worker (the paper's) or the fewest added ``cost``."""

    fresh = "fresh"
    cost = "cost"


class LaiaVariant(str, enum.Enum):
    """``exact`` is the paper's Algorithm 1; ``chunked`` its lock-free parallel form."""

    exact = "exact"
    chunked = "chunked"
    adaptive = "adaptive"


class SyncMode(str, enum.Enum):
    ps = "ps"
    p2p = "p2p"


class Transport(str, enum.Enum):
    """How workers reach the PS ranks' rows (docs/design.md section 12)."""

    auto = "auto"  # rma when every rank is on one host, else packed
    rma = "rma"  # one-sided Get/Put/Accumulate on the PS windows
    packed = "packed"  # one message per PS rank per operation, applied by the PS


class WirePrecision(str, enum.Enum):
    """What rows and gradients are rounded to when they travel (hybrid/wire_format.py)."""

    fp32 = "fp32"  # the model's own precision, bit for bit
    bf16 = "bf16"  # bfloat16: half the bytes of fp32 on every link
    fp16 = "fp16"  # refused: needs loss scaling (FP16_REFUSED)


FP16_REFUSED = ("fp16 is refused: its 5-bit exponent flushes gradients below 6e-8 to zero and overflows above 65504, "
                "which needs loss scaling this system does not do; use bf16 (fp32's exponent range)")


class DenseOptimizer(str, enum.Enum):
    sgd = "sgd"
    adagrad = "adagrad"
    adam = "adam"


class LrSchedule(str, enum.Enum):
    """How both learning rates change over a run, after ``train.lr_warmup`` (hybrid/lr_schedule.py)."""

    constant = "constant"
    step = "step"  # times train.lr_step_gamma every train.lr_step_every iterations (0: every epoch)
    cosine = "cosine"  # half a cosine down to train.lr_min_ratio at the run's end


class EmbeddingOptimizer(str, enum.Enum):
    sgd = "sgd"
    rowwise_adagrad = "rowwise_adagrad"  # FBGEMM's EXACT_ROWWISE_ADAGRAD: one accumulator per row


@dataclass
class SyntheticConfig:
    """How ``hybrid synth --config`` makes the store at ``data.path``."""

    like: str = "criteo-kaggle"
    rows: int = 200_000
    scale: float = 0.001
    seed: int = 0
    # the session process's recurrence, None = the profile's (docs/data.md, "Synthetic data"): runs of a context's
    # samples, returns of recently ended contexts, and how many recent ones a return picks from
    stickiness: Optional[float] = None
    revisit: Optional[float] = None
    recent: Optional[int] = None

    def recurrence(self) -> dict:
        """The recurrence settings given here, for :func:`hybrid.data.synthetic.synthesize`."""
        return {k: v for k, v in (("stickiness", self.stickiness), ("revisit", self.revisit),
                                  ("recent", self.recent)) if v is not None}


@dataclass
class DataConfig:
    path: str = "data/store"
    synthetic: Optional[SyntheticConfig] = None
    test_fraction: float = 0.1
    validation_fraction: float = 0.0  # samples just before the test split, evaluated during training
    shuffle: bool = False  # a fresh permutation each epoch, drawn from shuffle_seed and the epoch
    shuffle_seed: int = 0


@dataclass
class ModelConfig:
    name: ModelName = ModelName.dlrm
    embedding_dim: int = 16
    bottom_mlp: List[int] = field(default_factory=lambda: [64, 16])
    top_mlp: List[int] = field(default_factory=lambda: [64, 32])
    precision: Precision = Precision.float32


@dataclass
class ClusterConfig:
    """Rank roles: ``ps`` ranks hold the tables, the rest are workers."""

    workers: int = 8
    ps: int = 1
    transport: Transport = Transport.auto
    shard_plan: str = ""  # a plan from `hybrid plan-shards` (JSON); empty: contiguous row ranges
    wire_precision: WirePrecision = WirePrecision.fp32  # rows and gradients on the wire (docs/design.md section 14)


@dataclass
class TrainConfig:
    batch_per_worker: int = 128
    iterations: int = 0  # global batches to train (0 = epochs passes over the train split)
    epochs: int = 1  # passes over the train split (with iterations = 0)
    embedding_lr: float = 0.1
    dense_lr: float = 0.1
    dense_optimizer: DenseOptimizer = DenseOptimizer.sgd
    embedding_optimizer: EmbeddingOptimizer = EmbeddingOptimizer.sgd  # see hybrid/embedding_optimizer.py
    embedding_eps: float = 1e-8  # row-wise Adagrad's epsilon (FBGEMM's default)
    lr_schedule: LrSchedule = LrSchedule.constant  # both learning rates' schedule (hybrid/lr_schedule.py)
    lr_warmup: int = 0  # iterations of linear warm-up before the schedule
    lr_step_every: int = 0  # step schedule: iterations between decays (0 = one epoch)
    lr_step_gamma: float = 0.1  # step schedule: factor of each decay
    lr_min_ratio: float = 0.0  # cosine schedule: the final rate, as a fraction of the configured one
    eval_every: int = 0  # iterations between evaluations on the validation split (else test); also each epoch's end
    keep_best: bool = True  # test the model of the best validation AUC (with data.validation_fraction > 0)
    verify_cache: bool = False  # debug: each iteration, compare fresh cached rows with the PS
    overlap: bool = True  # read the next iteration's prefetchable rows and finish writes behind other work
    deterministic: bool = False  # add shared rows' gradients in worker order: bit-reproducible runs and resumes
    threads: int = 0  # torch compute threads per worker (0 = this host's cores / its ranks, at least 1)
    device: str = "auto"  # auto (a GPU when CUDA is present), cpu, cuda (hybrid/runtime/accelerator.py)
    allreduce: str = "auto"  # MLP gradients: auto, horovod (NCCL/MPI/Gloo), host (host-staged), mpi; see accelerator
    watchdog_seconds: float = 600.0  # a worker with no finished iteration for this long reports and ends the job
    checkpoint_every: int = 0  # iterations between checkpoints, and one at the end (0 = only on SIGTERM/SIGUSR1)
    checkpoint_keep: int = 2  # complete checkpoints kept (older ones are deleted)
    checkpoint_dir: str = ""  # default: checkpoints/<name>


@dataclass
class CacheConfig:
    ratio: float = 0.1
    policy: CachePolicy = CachePolicy.lru


@dataclass
class SchedulerConfig:
    mode: str = "herald"  # a registered mode's name (hybrid.modes.MODES); a Mode once loaded
    laia: LaiaVariant = LaiaVariant.exact
    order: LaiaOrder = LaiaOrder.arrival  # exact and adaptive LAIA: arrival (the paper's) or confident first
    scoring: LaiaScoring = LaiaScoring.fresh  # exact and adaptive LAIA: fresh rows (the paper's) or added cost
    swap_rounds: int = 0  # scoring=cost: rounds of pairwise exchanges that lower the batch's reads
    lookahead: bool = False  # scoring=cost: of both orders, keep the one that leaves the next batch cheaper too
    blocks: int = 1  # scoring=cost: samples placed in rounds of this many concurrent blocks (1: one after another)
    block_size: int = 32  # scoring=cost, blocks > 1: samples of a block per round
    sync: SyncMode = SyncMode.ps
    chunks: int = 8
    threads: int = 0  # the scheduler's threads (0 = the rank's compute threads: hybrid.runtime.launch_facts)
    staleness: int = 0
    warmup_iterations: int = 10
    score_tables: int = 0  # adaptive LAIA: tables to score (0 = from budget_ms, or all)
    budget_ms: float = 0.0  # adaptive LAIA: scoring budget per batch (0 = unlimited)

    def __post_init__(self):
        if isinstance(self.mode, str) and self.mode.isidentifier():  # else validate() names the key
            self.mode = Mode(self.mode)


@dataclass
class FaeConfig:
    budget_mb: float = 256.0  # memory for the hot rows replicated on every worker (tables under 1 MB included)
    sample_fraction: float = 0.05  # of the training inputs, for the access counts
    heldout_samples: int = 4096  # of the test split, for the loss that sets the strip lengths
    small_table_kb: float = 1024.0  # tables smaller than this are hot whole (the paper: 1 MB)


@dataclass
class Config:
    name: str = "unnamed"
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    fae: FaeConfig = field(default_factory=FaeConfig)

    @property
    def global_batch(self) -> int:
        return self.cluster.workers * self.train.batch_per_worker

    @property
    def row_width(self) -> int:
        """Values per stored row: the embedding, then its optimizer state (row-wise Adagrad: one accumulator)."""
        return self.model.embedding_dim + (self.train.embedding_optimizer is EmbeddingOptimizer.rowwise_adagrad)

    @property
    def row_bytes(self) -> int:
        """Bytes of one stored row (what a PS rank stores and a transmission moves per row), state included."""
        return self.row_width * (8 if self.model.precision is Precision.float64 else 4)

    def run_length(self, per_epoch: int) -> int:
        """Global batches a run trains when one pass over the train split is ``per_epoch`` of them."""
        return self.train.iterations or self.train.epochs * per_epoch

    def to_dict(self) -> dict:
        """Plain JSON-able dict (enums as their values)."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=_enum_value))

    def digest(self) -> str:
        """Stable hash of the resolved config; ranks compare it at start-up."""
        return _digest(self.to_dict())

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.train.checkpoint_dir or f"checkpoints/{self.name}")

    def training_dict(self) -> dict:
        """The config without the keys that do not change what is trained (a resume may change them)."""
        values = self.to_dict()
        for dotted in RUN_ONLY_KEYS:
            section, key = dotted.split(".")
            values[section].pop(key)
        return values

    def training_digest(self) -> str:
        """Hash of :meth:`training_dict`: a checkpoint resumes only under the same one."""
        return _digest(self.training_dict())


# Keys a resumed run may change: where and how often it saves, how it watches and reports,
# how it reaches the PS, the order shared gradients are added in and where the MLP computes
# (last bits only). Every other key changes the result and must match the checkpoint's.
RUN_ONLY_KEYS = ("train.checkpoint_every", "train.checkpoint_keep", "train.checkpoint_dir",
                 "train.watchdog_seconds", "train.eval_every", "train.keep_best", "train.verify_cache",
                 "train.deterministic",
                 "train.device", "train.allreduce", "cluster.transport")

# Keys a resumed run may change without changing what BSP trains, as long as the global batch
# (workers x batch per worker) stays: the cluster's shape (the PS rows are re-sharded, the
# scheduler starts cold), its caches (fewer workers need larger ones; only the schedule changes)
# and the run's length (a run is continued for more iterations or epochs; a decaying learning-rate
# schedule then follows the new length from the resumed iteration on). Modes whose caches change
# values (HET) write no checkpoints.
RESHAPE_KEYS = ("cluster.workers", "cluster.ps", "cluster.shard_plan", "train.batch_per_worker",
                "train.iterations", "train.epochs", "cache.ratio", "cache.policy")


def flatten(values: dict, prefix: str = "") -> dict:
    """Nested dicts as one dict of dotted keys (``{'train': {'seed': 0}}`` -> ``{'train.seed': 0}``)."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _digest(values: dict) -> str:
    text = json.dumps(values, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _enum_value(value):
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"not JSON serializable: {value!r}")


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Config from an optional YAML file and ``key=value`` overrides, validated."""
    merged = _schema()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        with _errors_named(f"{path}: "):
            merged = _with_yaml(path.read_text(encoding="utf-8"))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. cluster.workers=4)")
    if overrides:
        # ``key=`` is an empty value (e.g. cluster.shard_plan= for the default plan); OmegaConf would read null
        overrides = [item + "''" if item.endswith("=") else item for item in overrides]
        with _errors_named("override "):
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
    with _errors_named(""):
        config = OmegaConf.to_object(merged)
    validate(config)
    return config


@functools.lru_cache(maxsize=1)
def _schema():
    """The typed schema of :class:`Config`, built once per process.

    Building it reads every dataclass's annotations: 15 ms of the 40 ms a
    config took to load, paid on every rank of every run and test. Nothing
    changes it: ``OmegaConf.merge`` copies its first argument and
    ``OmegaConf.to_object`` only reads.
    """
    return OmegaConf.structured(Config)


@functools.lru_cache(maxsize=16)
def _with_yaml(text: str):
    """The schema merged with a config file's text (cached on the text, never on a file's name or time)."""
    return OmegaConf.merge(_schema(), OmegaConf.load(io.StringIO(text)))


@contextlib.contextmanager
def _errors_named(source: str):
    """Turn OmegaConf's and YAML's multi-line errors into one line naming source and key (or line)."""
    try:
        yield
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        raise ConfigError(f"{source}{key}: {str(err).splitlines()[0]}") from None
    except yaml.YAMLError as err:  # also a !!python/... tag: the safe loader refuses it, nothing runs
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{source}not a valid config: {where}{problem}") from None


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def _non_finite(value, key: str = "") -> Optional[str]:
    """The first float key (dotted) of a config dataclass whose value is inf or nan, or None."""
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            found = _non_finite(getattr(value, f.name), f"{key}{f.name}.")
            if found:
                return found
    elif isinstance(value, float) and not math.isfinite(value):
        return key.rstrip(".")
    return None


def validate(config: Config) -> None:
    """Range and cross-field checks that types alone cannot express."""
    from hybrid.data.synthetic import PROFILES

    c = config
    bad = _non_finite(c)
    _check(bad is None, str(bad), "must be a finite number, got inf or nan")
    _check(c.cluster.workers >= 1, "cluster.workers", f"must be >= 1, got {c.cluster.workers}")
    _check(c.cluster.ps >= 1, "cluster.ps", f"must be >= 1, got {c.cluster.ps}")
    _check(c.train.batch_per_worker >= 1, "train.batch_per_worker", f"must be >= 1, got {c.train.batch_per_worker}")
    _check(c.train.iterations >= 0, "train.iterations",
           f"must be >= 0 (0 = train.epochs passes), got {c.train.iterations}")
    _check(c.train.epochs >= 1, "train.epochs", f"must be >= 1, got {c.train.epochs}")
    _check(c.train.epochs == 1 or not c.train.iterations, "train.epochs",
           f"set train.epochs or train.iterations, not both (got {c.train.epochs} and {c.train.iterations})")
    _check(c.train.lr_warmup >= 0, "train.lr_warmup", f"must be >= 0, got {c.train.lr_warmup}")
    _check(c.train.lr_step_every >= 0, "train.lr_step_every",
           f"must be >= 0 (0 = every epoch), got {c.train.lr_step_every}")
    _check(0 < c.train.lr_step_gamma <= 1, "train.lr_step_gamma", f"must be in (0, 1], got {c.train.lr_step_gamma}")
    _check(0 <= c.train.lr_min_ratio <= 1, "train.lr_min_ratio", f"must be in [0, 1], got {c.train.lr_min_ratio}")
    _check(c.train.embedding_lr > 0, "train.embedding_lr", f"must be > 0, got {c.train.embedding_lr}")
    _check(c.train.dense_lr > 0, "train.dense_lr", f"must be > 0, got {c.train.dense_lr}")
    _check(c.train.watchdog_seconds >= 0, "train.watchdog_seconds",
           f"must be >= 0 (0 = off), got {c.train.watchdog_seconds}")
    _check(c.train.threads >= 0, "train.threads", f"must be >= 0 (0 = cores / ranks per host), got {c.train.threads}")
    _check(c.train.checkpoint_every >= 0, "train.checkpoint_every",
           f"must be >= 0 (0 = only when stopped by a signal), got {c.train.checkpoint_every}")
    _check(c.train.checkpoint_keep >= 1, "train.checkpoint_keep", f"must be >= 1, got {c.train.checkpoint_keep}")
    _check(c.train.eval_every >= 0, "train.eval_every", f"must be >= 0 (0 = only at the end), got {c.train.eval_every}")
    _check(c.train.device in ("auto", "cpu", "cuda"), "train.device",
           f"expected one of auto, cpu, cuda, got {c.train.device!r}")
    _check(c.train.embedding_eps > 0, "train.embedding_eps", f"must be > 0, got {c.train.embedding_eps}")
    _check(c.train.allreduce in ("auto", "horovod", "host", "mpi"), "train.allreduce",
           f"expected one of auto, horovod, host, mpi, got {c.train.allreduce!r}")
    _check(c.cluster.wire_precision is not WirePrecision.fp16, "cluster.wire_precision", FP16_REFUSED)
    _check(c.cluster.wire_precision is WirePrecision.fp32 or c.train.embedding_optimizer is EmbeddingOptimizer.sgd,
           "cluster.wire_precision", f"{c.cluster.wire_precision.value} is not supported with "
           f"train.embedding_optimizer={c.train.embedding_optimizer.value}: its shared rows' gradient sum and its "
           f"accumulators have no 16-bit rounding defined yet; use train.embedding_optimizer=sgd or "
           f"cluster.wire_precision=fp32")
    _check(c.model.embedding_dim >= 1, "model.embedding_dim", f"must be >= 1, got {c.model.embedding_dim}")
    for key in ("bottom_mlp", "top_mlp"):
        widths = getattr(c.model, key)
        _check(all(w >= 1 for w in widths), f"model.{key}", f"layer widths must be >= 1, got {widths}")
    _check(0.0 < c.cache.ratio <= 1.0, "cache.ratio", f"must be in (0, 1], got {c.cache.ratio}")
    _check(0.0 <= c.data.test_fraction < 1.0, "data.test_fraction", f"must be in [0, 1), got {c.data.test_fraction}")
    _check(0.0 <= c.data.validation_fraction < 1.0 - c.data.test_fraction, "data.validation_fraction",
           f"must be >= 0 and leave samples to train on beside data.test_fraction={c.data.test_fraction}, "
           f"got {c.data.validation_fraction}")
    _check(isinstance(c.scheduler.mode, Mode), "scheduler.mode",
           f"a mode's name (docs/modes.md), got {c.scheduler.mode!r}")
    _check(c.scheduler.chunks >= 1, "scheduler.chunks", f"must be >= 1, got {c.scheduler.chunks}")
    _check(c.scheduler.blocks >= 1, "scheduler.blocks", f"must be >= 1, got {c.scheduler.blocks}")
    _check(c.scheduler.block_size >= 1, "scheduler.block_size", f"must be >= 1, got {c.scheduler.block_size}")
    _check(c.scheduler.threads >= 0, "scheduler.threads",
           f"must be >= 0 (0 = the rank's compute threads), got {c.scheduler.threads}")
    _check(c.scheduler.staleness >= 0, "scheduler.staleness", f"must be >= 0, got {c.scheduler.staleness}")
    _check(c.scheduler.warmup_iterations >= 0, "scheduler.warmup_iterations",
           f"must be >= 0, got {c.scheduler.warmup_iterations}")
    _check(c.scheduler.score_tables >= 0, "scheduler.score_tables", f"must be >= 0, got {c.scheduler.score_tables}")
    _check(c.scheduler.budget_ms >= 0, "scheduler.budget_ms", f"must be >= 0, got {c.scheduler.budget_ms}")
    _check(c.fae.budget_mb >= 0, "fae.budget_mb", f"must be >= 0, got {c.fae.budget_mb}")
    _check(0 < c.fae.sample_fraction <= 1, "fae.sample_fraction", f"must be in (0, 1], got {c.fae.sample_fraction}")
    _check(c.fae.heldout_samples >= 1, "fae.heldout_samples", f"must be >= 1, got {c.fae.heldout_samples}")
    _check(c.fae.small_table_kb >= 0, "fae.small_table_kb", f"must be >= 0, got {c.fae.small_table_kb}")
    _check(bool(c.data.path), "data.path", "must name the store directory")
    synthetic = c.data.synthetic
    if synthetic is not None:
        _check(synthetic.like in PROFILES, "data.synthetic.like",
               f"unknown profile {synthetic.like!r}; expected one of {sorted(PROFILES)}")
        _check(synthetic.rows >= 1, "data.synthetic.rows", f"must be >= 1, got {synthetic.rows}")
        _check(synthetic.scale > 0, "data.synthetic.scale", f"must be > 0, got {synthetic.scale}")
        _check(synthetic.stickiness is None or 0 <= synthetic.stickiness < 1, "data.synthetic.stickiness",
               f"must be in [0, 1), got {synthetic.stickiness}")
        _check(synthetic.revisit is None or 0 <= synthetic.revisit <= 1, "data.synthetic.revisit",
               f"must be in [0, 1], got {synthetic.revisit}")
        _check(synthetic.recent is None or synthetic.recent >= 1, "data.synthetic.recent",
               f"must be >= 1, got {synthetic.recent}")
