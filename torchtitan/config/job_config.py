"""Job configuration: one dataclass per TOML section, composed into ``JobConfig``.

A run is configured by a TOML file (``--job.config_file``) plus command-line
overrides (``--section.field value`` or ``--section.field=value``); the command
line wins. Every value is checked against the field's declared type, and every
mistake is reported as a ``ConfigError`` naming where it came from, the
section/field, the offending value and what was expected.

Paths are kept exactly as written: like TorchTitan, they are resolved against
the working directory the trainer is launched from.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import math
import os
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from zephon.schema import KeyLines, did_you_mean, matches, read_toml


class ConfigError(ValueError):
    """The job configuration (TOML file or command line) is invalid."""


@dataclass
class Job:
    config_file: str = ""
    """TOML file the rest of the configuration was loaded from ("" = defaults only)."""
    dump_folder: str = "./outputs"
    """Root folder for checkpoints, TensorBoard logs and metrics of this run."""
    description: str = ""
    heartbeat_timeout_s: float = 150.0
    """A rank whose heartbeat stops for this long (frozen, stopped) ends the job
    with a message naming it; above a slow first batch, below the 600 s
    collective timeout. 0 turns the watchdog off."""


@dataclass
class Model:
    name: str = "llama3"
    """The model, a key of the registry in torchtitan/models/__init__.py (checked
    there: `check_model_name`)."""
    flavor: str = "debugmodel"
    """A flavor of the model (llama3: debugmodel, 1B, 8B; vlm: debugmodel, 1B), or
    "hf" (llama3): the shape of a Hugging Face config.json (``hf_config``, else
    ``checkpoint.initial_load_path``)."""
    hf_config: str = ""
    """With flavor "hf": a Hugging Face config.json or its folder."""
    attention: Literal["doc_causal", "causal"] = "doc_causal"
    """doc_causal: attend only within the same packed document; causal: whole row."""
    attention_impl: Literal["auto", "dense", "flex"] = "auto"
    """How doc_causal masks: dense = boolean [rows, 1, S, S] mask for SDPA; flex =
    FlexAttention block mask (compiled on CUDA; forward only on CPU); auto = flex on
    CUDA, dense on CPU."""


@dataclass
class Training:
    seq_len: int = 256
    global_batch_size: int = 32
    """Rows per optimizer step, summed over all data-parallel ranks."""
    local_batch_size: int = 4
    """Rows per micro-batch on one rank; the rest is gradient accumulation."""
    local_batch_tokens: int = 0
    """Tokens per micro-batch on one rank instead of local_batch_size (0 = off): each
    data phase runs micro-batches of local_batch_tokens / its seq_len rows, so memory
    stays flat when a phase lengthens seq_len. A multiple of every phase's seq_len.
    Exclusive with local_batch_size: both in one place is an error; the command line's
    choice replaces the config file's."""
    steps: int = 50
    """Optimizer steps; 0 builds and initialises the model (and validates) only."""
    seed: int = 0
    max_norm: float = 1.0
    """Gradient-norm clipping threshold."""
    mixed_precision_param: Literal["bfloat16", "float32"] = "bfloat16"
    mixed_precision_reduce: Literal["float32", "bfloat16"] = "float32"
    activation_checkpoint: Literal["none", "full"] = "none"
    compile: bool = False
    deterministic: bool = False
    log_init_digest: bool = False
    """Log a SHA-256 of the initial weights (gathers full tensors: small models only)."""
    max_nonfinite_steps: int = 3
    """A step whose loss or gradient norm is NaN/inf, or whose loss spikes, is not applied
    (its batch is still consumed); this many such steps in a row stop the job (exit 2)
    with a message naming the newest checkpoint from before the trouble began."""
    loss_spike_factor: float = 4.0
    """A finite global loss above this many times the median loss of the last 32 applied
    steps is a spike, treated like a non-finite step; 0 turns spike tracking off (it
    costs one scalar all-reduce per step)."""
    gc_every_steps: int = 50
    """Python's garbage collection runs every this many steps (its young generations;
    all of them every 20th time), the same steps on every rank, instead of whenever
    allocations pass Python's threshold; 0 leaves it to Python
    (torchtitan/components/garbage_collection.py)."""


# The pipeline schedules of `torch.distributed.pipelining` the trainer offers: the
# first two run one stage per process, the third several (virtual stages).
PIPELINE_SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B")
# Schedules torch has that the trainer refuses, and why (docs/parallelism.md).
REFUSED_SCHEDULES = {
    name: "torch 2.13's zero-bubble schedules gave other gradients than 1F1B on the same "
    "batch, so they are not offered (docs/parallelism.md)"
    for name in ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
}


@dataclass
class Parallelism:
    data_parallel_replicate_degree: int = 1
    """HSDP replicas (outer dimension: typically one per node group); -1 = one per node
    of the launch (torchrun's node count), so it follows the job across elastic restarts."""
    data_parallel_shard_degree: int = -1
    """FSDP degree within a replica; -1 = the processes left over by the other degrees."""
    tensor_parallel_degree: int = 1
    """Llama 3 tensor parallelism with sequence-parallel norms (innermost dimension)."""
    pipeline_parallel_degree: int = 1
    """Pipeline stages (outermost dimension): each process holds a slice of the layers."""
    pipeline_parallel_schedule: str = "1F1B"
    """One of PIPELINE_SCHEDULES (`torch.distributed.pipelining`)."""
    pipeline_parallel_microbatch_size: int = 1
    """Rows per pipeline micro-batch; a rank's rows per step must be a multiple of it,
    giving at least as many micro-batches as stages."""
    pipeline_parallel_stages_per_rank: int = 0
    """Virtual stages each process runs; 0 = 1 for GPipe and 1F1B, 2 for
    Interleaved1F1B (which takes several)."""
    expert_parallel_degree: int = 1
    """Mixture-of-experts models: the routed experts are split over groups of this many
    data-parallel ranks, and each token is sent to the rank that holds its experts
    (all-to-all) instead of every rank gathering every expert. Divides the
    data-parallel size and the expert count."""
    defer_grad_sync: bool = False
    """Reduce gradients only on the last micro-batch: fewer collectives, but every rank
    holds the whole model's unsharded gradients until then (small models only)."""
    max_idle_share: float = 1.0
    """Zephon loader: refuse a data-parallel size whose padding rows (ranks owning fewer
    lanes, or a micro-batch that does not divide the local batch) exceed this share of
    the rows run; 1.0 allows any, 0.0 only even layouts."""


@dataclass
class MoE:
    """Routing balance of a mixture-of-experts model (`[model] name = "moe"`)."""

    balance: Literal["bias", "global_aux", "micro_batch_aux", "none"] = "bias"
    """bias: DeepSeek-V3's auxiliary-loss-free balance, a per-expert routing bias moved
    after each step by the step's expert loads; global_aux: the load-balance loss with
    expert loads of the whole global batch (one extra forward pass a step counts them
    first); micro_batch_aux: the usual load-balance loss per micro-batch (depends on
    how the batch is split, so on the GPU count); none. The first two are layout-free."""
    aux_loss_coef: float = 0.01
    """Weight of the load-balance loss (global_aux, micro_batch_aux)."""
    bias_update_rate: float = 0.001
    """How far each step moves an expert's routing bias (balance = bias)."""
    z_loss_coef: float = 0.0
    """Router z-loss weight (mean squared log-sum-exp of the router logits); 0 = off."""
    top_k: int = 0
    """Experts each token goes to; 0 = the flavor's."""


@dataclass
class Checkpoint:
    enable: bool = True
    folder: str = "checkpoint"
    """Relative to job.dump_folder."""
    interval: int = 25
    keep_latest_k: int = 0
    """0 keeps every checkpoint."""
    load_step: int = -1
    """-1 resumes from the latest complete checkpoint, if any."""
    initial_load_path: str = ""
    """Weights to start from when the run has no checkpoint of its own: a Hugging
    Face Llama folder (config.json + safetensors) or a step folder of this trainer.
    Starts at step 0 with a fresh LR schedule and loader."""
    initial_load_optimizer: bool = False
    """Also take the optimizer state from an initial_load_path step folder."""
    async_mode: Literal["disabled", "async"] = "disabled"
    """async: write the DCP files in the background (dcp.async_save); the step folder
    is finalised (loader state, completion marker) once they are durable."""
    verify: Literal["full", "size"] = "full"
    """Checks of the resumed step against its manifest: "full" re-reads every file
    and compares checksums; "size" compares sizes and steps only."""


@dataclass
class Optimizer:
    name: Literal["AdamW"] = "AdamW"
    lr: float = 3e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1


@dataclass
class LRScheduler:
    warmup_steps: int = 5
    decay_ratio: float = 0.2
    """Fraction of training.steps spent decaying at the end (warmup-stable-decay)."""
    decay_type: Literal["linear", "cosine"] = "linear"
    min_lr_factor: float = 0.1
    """Final learning rate as a fraction of optimizer.lr."""
    decay_phase: str = ""
    """A data phase of the recipe (by name) whose steps the decay spans exactly, e.g.
    "anneal", instead of the last decay_ratio of training.steps; "" = off."""


@dataclass
class Metrics:
    log_freq: int = 1
    enable_tensorboard: bool = False
    save_tb_folder: str = "tb"
    """Relative to job.dump_folder."""
    jsonl_file: str = "metrics.jsonl"
    """Per-step JSON lines, relative to job.dump_folder ("" = off)."""
    enable_wandb: bool = False
    """Weights & Biases run in <dump_folder>/wandb (WANDB_MODE=offline: no network)."""
    wandb_project: str = "torchtitan"


@dataclass
class Validation:
    enable: bool = False
    recipe: str = ""
    freq: int = 0
    """Validate every N steps; 0 = only at the end."""
    steps: int = -1
    """Validation batches per evaluation; -1 = until the data is exhausted."""


@dataclass
class Data:
    loader: Literal["zephon", "hf"] = "zephon"
    recipe: str = "train_configs/data/sample_mix.toml"
    tokenizer: str = "assets/tokenizer/tokenizer.json"
    log_batch_digests: bool = False
    num_workers: int = -1
    """-1 = the recipe's value."""
    prefetch: int = -1
    """-1 = the recipe's value."""
    hf_resume: Literal["refuse", "skip"] = "refuse"
    """What the hf loader does on resume: refuse, or skip already-seen batches."""


@dataclass
class FaultTolerance:
    """Live recovery with torchft (docs/fault_tolerance.md): this job is one replica
    group of several; a lighthouse forms a quorum of the groups at every step, a lost
    group costs the step in flight, and a group that comes back copies its state from
    a live peer. Needs `pip install -e '.[ft]'`."""

    enable: bool = False
    replica_id: int = -1
    """This group's id in [0, group_count); -1 = the FT_REPLICA_ID environment variable."""
    group_count: int = 1
    """The most replica groups the job will have (ids 0..group_count-1)."""
    min_replicas: int = 1
    """Groups a step needs to commit; fewer wait for the quorum."""
    lighthouse: str = ""
    """host:port of the lighthouse; "" = the FT_LIGHTHOUSE environment variable."""
    connect_timeout_s: float = 20.0
    """How long to reach the lighthouse (and a peer to heal from) before giving up."""
    quorum_timeout_s: float = 60.0
    """How long a step waits for its quorum."""
    step_timeout_s: float = 30.0
    """How long a cross-group collective (or a commit vote) waits for a peer."""


@dataclass
class JobConfig:
    job: Job = field(default_factory=Job)
    model: Model = field(default_factory=Model)
    training: Training = field(default_factory=Training)
    parallelism: Parallelism = field(default_factory=Parallelism)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    optimizer: Optimizer = field(default_factory=Optimizer)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)
    metrics: Metrics = field(default_factory=Metrics)
    validation: Validation = field(default_factory=Validation)
    data: Data = field(default_factory=Data)
    fault_tolerance: FaultTolerance = field(default_factory=FaultTolerance)
    moe: MoE = field(default_factory=MoE)

    def __post_init__(self) -> None:
        # (section, field) -> where it was set ("config file 'x'", "command line (--y)");
        # filled by load_job_config. Not a field: never part of to_dict or equality.
        self.provenance: dict[tuple[str, str], str] = {}

    def set_by(self, section: str, name: str) -> str | None:
        """Where `[section] name` was set on purpose (config file or command line),
        or None when it holds its default."""
        return self.provenance.get((section, name))

    def explicit_shape(self) -> tuple[str, ...]:
        """Which of training.seq_len and training.global_batch_size the user set on
        purpose: a recipe's first data phase may not disagree with those."""
        return tuple(n for n in ("seq_len", "global_batch_size") if self.set_by("training", n))

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dict (section -> field -> value), e.g. for logging."""
        return dataclasses.asdict(self)


# Aliases so other modules can annotate with the section they consume.
OptimizerConfig = Optimizer
LRSchedulerConfig = LRScheduler
MetricsConfig = Metrics
MoEConfig = MoE


# --------------------------------------------------------------------------- schema


def _sections() -> dict[str, type]:
    return {f.name: typing.get_type_hints(JobConfig)[f.name] for f in dataclasses.fields(JobConfig)}


def _field_types(section_cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(section_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(section_cls)}


def _describe(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(tp))
    return {
        bool: "a boolean (true/false)",
        int: "an integer",
        float: "a number",
        str: "a string",
    }[tp]


def _closest_schedule(name: str) -> str:
    """Case-blind: "1f1b" and "interleaved_1f1b" find their schedule."""
    folded = {s.lower(): s for s in PIPELINE_SCHEDULES}
    close = difflib.get_close_matches(name.lower().replace("_", ""), list(folded), n=1)
    return f"; did you mean {folded[close[0]]!r}?" if close else ""


# --------------------------------------------------------------------------- coercion

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _convert(value: Any, tp: Any, from_cli: bool) -> Any:
    """Return ``value`` as type ``tp``, or raise ValueError. CLI values arrive as text;
    TOML values are already typed and must match (no silent "256" -> 256)."""
    if typing.get_origin(tp) is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ValueError
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if from_cli and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError
    if tp not in (int, float, str):
        raise TypeError(f"unsupported config field type {tp!r}")
    if from_cli:
        return tp(value)  # int() rejects "1.5" and "1e3"
    ok, value = matches(value, (tp,))  # TOML's types, as the recipe's tables take them
    if not ok:
        raise ValueError
    return value


def _lookup_section(section: str, source: str) -> type:
    sections = _sections()
    if section not in sections:
        raise ConfigError(
            f"{source}: unknown section [{section}]{did_you_mean(section, list(sections), '[{}]')} "
            f"(known sections: {', '.join(sections)})"
        )
    return sections[section]


def _lookup_field(section: str, name: str, source: str) -> Any:
    types = _field_types(_lookup_section(section, source))
    if name not in types:
        raise ConfigError(
            f"{source}: unknown field {name!r} in [{section}]{did_you_mean(name, list(types))} "
            f"(known fields: {', '.join(types)})"
        )
    return types[name]


def _set(
    cfg: JobConfig,
    section: str,
    name: str,
    value: Any,
    source: str,
    provenance: dict[tuple[str, str], str],
    from_cli: bool,
) -> None:
    tp = _lookup_field(section, name, source)
    try:
        converted = _convert(value, tp, from_cli)
    except ValueError:
        raise ConfigError(
            f"{source}: [{section}] {name} = {value!r} is invalid: expected {_describe(tp)}"
        ) from None
    setattr(getattr(cfg, section), name, converted)
    provenance[(section, name)] = source


# --------------------------------------------------------------------------- sources


def _apply_toml(
    cfg: JobConfig,
    path: str,
    data: dict[str, Any],
    lines: KeyLines,
    provenance: dict[tuple[str, str], str],
) -> None:
    def source(section: str, name: str = "") -> str:
        line = lines.get((section, name)) or lines.get((section, ""))
        return f"config file {path!r}" + (f" (line {line})" if line else "")

    for section, table in data.items():
        _lookup_section(section, source(section))
        if not isinstance(table, dict):
            raise ConfigError(
                f"{source('', section)}: {section} = {table!r} is invalid: expected a table "
                f"[{section}]"
            )
        for name, value in table.items():
            _set(cfg, section, name, value, source(section, name), provenance, from_cli=False)


def _parse_argv(argv: list[str]) -> list[tuple[str, str, str | None]]:
    """Split argv into (flag, key, value) triples; value None = bare boolean flag."""
    out: list[tuple[str, str, str | None]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(
                f"command line: unexpected argument {arg!r}: expected --section.field value"
            )
        key, eq, value = arg[2:].partition("=")
        if eq:
            out.append((arg, key, value))
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out.append((arg, key, argv[i + 1]))
            i += 2
        else:
            out.append((arg, key, None))
            i += 1
    return out


def _apply_cli(
    cfg: JobConfig,
    overrides: list[tuple[str, str, str | None]],
    provenance: dict[tuple[str, str], str],
) -> None:
    for flag, key, value in overrides:
        source = f"command line ({flag.partition('=')[0]})"
        section, dot, name = key.partition(".")
        if not dot or not section or not name or "." in name:
            raise ConfigError(f"{source}: expected --section.field, e.g. --training.steps 10")
        if value is None:
            # A bare flag means true, but only for boolean fields.
            tp = _lookup_field(section, name, source)
            if tp is not bool:
                raise ConfigError(f"{source}: [{section}] {name} needs a value: {_describe(tp)}")
            value = "true"
        _set(cfg, section, name, value, source, provenance, from_cli=True)


# --------------------------------------------------------------------------- validation


def _check_ranges(cfg: JobConfig, provenance: dict[tuple[str, str], str]) -> None:
    """Reject values that have the right type but make no sense."""
    rules: list[tuple[str, str, Any, str]] = [
        ("job", "heartbeat_timeout_s", lambda v: v == 0 or v >= 1, "0 (off) or seconds >= 1"),
        ("training", "seq_len", lambda v: v >= 1, "an integer >= 1"),
        ("training", "global_batch_size", lambda v: v >= 1, "an integer >= 1"),
        ("training", "local_batch_size", lambda v: v >= 1, "an integer >= 1"),
        ("training", "local_batch_tokens", lambda v: v >= 0, "0 (off) or tokens >= 1"),
        ("training", "steps", lambda v: v >= 0, "an integer >= 0 (0: initialise only)"),
        ("training", "max_norm", lambda v: v > 0, "a number > 0"),
        ("training", "max_nonfinite_steps", lambda v: v >= 1, "an integer >= 1"),
        ("training", "gc_every_steps", lambda v: v >= 0, "0 (Python's own) or a positive integer"),
        ("training", "loss_spike_factor", lambda v: v == 0 or v > 1, "0 (off) or a number > 1"),
        (
            "parallelism",
            "data_parallel_replicate_degree",
            lambda v: v == -1 or v >= 1,
            "-1 (one replica per node) or an integer >= 1",
        ),
        ("parallelism", "data_parallel_shard_degree", lambda v: v == -1 or v >= 1, "-1 or >= 1"),
        ("parallelism", "tensor_parallel_degree", lambda v: v >= 1, "an integer >= 1"),
        ("parallelism", "pipeline_parallel_degree", lambda v: v >= 1, "an integer >= 1"),
        ("parallelism", "expert_parallel_degree", lambda v: v >= 1, "an integer >= 1"),
        ("moe", "aux_loss_coef", lambda v: v >= 0, "a number >= 0"),
        ("moe", "bias_update_rate", lambda v: v >= 0, "a number >= 0"),
        ("moe", "z_loss_coef", lambda v: v >= 0, "a number >= 0"),
        ("moe", "top_k", lambda v: v >= 0, "0 (the flavor's) or an integer >= 1"),
        (
            "parallelism",
            "pipeline_parallel_schedule",
            lambda v: v in PIPELINE_SCHEDULES,
            f"one of {', '.join(PIPELINE_SCHEDULES)}",
        ),
        ("parallelism", "pipeline_parallel_microbatch_size", lambda v: v >= 1, "rows >= 1"),
        (
            "parallelism",
            "pipeline_parallel_stages_per_rank",
            lambda v: v >= 0,
            "0 (the schedule's default) or an integer >= 1",
        ),
        ("parallelism", "max_idle_share", lambda v: 0 <= v <= 1, "a share in [0, 1]"),
        ("checkpoint", "interval", lambda v: v >= 1, "an integer >= 1"),
        ("checkpoint", "keep_latest_k", lambda v: v >= 0, "an integer >= 0"),
        ("checkpoint", "load_step", lambda v: v >= -1, "-1 or a step >= 0"),
        ("optimizer", "lr", lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
        ("optimizer", "beta1", lambda v: 0 <= v < 1, "a number in [0, 1)"),
        ("optimizer", "beta2", lambda v: 0 <= v < 1, "a number in [0, 1)"),
        ("optimizer", "eps", lambda v: v > 0, "a number > 0"),
        ("optimizer", "weight_decay", lambda v: v >= 0, "a number >= 0"),
        ("lr_scheduler", "warmup_steps", lambda v: v >= 0, "an integer >= 0"),
        ("lr_scheduler", "decay_ratio", lambda v: 0 <= v <= 1, "a number in [0, 1]"),
        ("lr_scheduler", "min_lr_factor", lambda v: 0 <= v <= 1, "a number in [0, 1]"),
        ("metrics", "log_freq", lambda v: v >= 1, "an integer >= 1"),
        ("validation", "freq", lambda v: v >= 0, "an integer >= 0"),
        ("validation", "steps", lambda v: v == -1 or v >= 1, "-1 or an integer >= 1"),
        ("data", "num_workers", lambda v: v >= -1, "-1 or an integer >= 0"),
        ("data", "prefetch", lambda v: v >= -1, "-1 or an integer >= 0"),
        ("fault_tolerance", "group_count", lambda v: v >= 1, "an integer >= 1"),
        ("fault_tolerance", "min_replicas", lambda v: v >= 1, "an integer >= 1"),
        ("fault_tolerance", "connect_timeout_s", lambda v: v > 0, "seconds > 0"),
        ("fault_tolerance", "quorum_timeout_s", lambda v: v > 0, "seconds > 0"),
        ("fault_tolerance", "step_timeout_s", lambda v: v > 0, "seconds > 0"),
    ]
    for section, name, ok, expected in rules:
        value = getattr(getattr(cfg, section), name)
        if not ok(value):
            source = provenance.get((section, name), "default")
            hint = ""
            if name == "pipeline_parallel_schedule":
                hint = (
                    f" ({REFUSED_SCHEDULES[value]})"
                    if value in REFUSED_SCHEDULES
                    else (_closest_schedule(value))
                )
            raise ConfigError(
                f"{source}: [{section}] {name} = {value!r} is invalid: expected {expected}{hint}"
            )


# --------------------------------------------------------------------------- entry points


def help_text() -> str:
    lines = ["usage: --job.config_file PATH [--section.field VALUE | --section.field=VALUE]..."]
    default = JobConfig()
    for section, cls in _sections().items():
        lines.append(f"\n[{section}]")
        for name, tp in _field_types(cls).items():
            value = getattr(getattr(default, section), name)
            lines.append(f"  --{section}.{name}  ({_describe(tp)}, default {value!r})")
    return "\n".join(lines)


def load_job_config(argv: list[str] | None = None) -> JobConfig:
    """Build the JobConfig from defaults, ``--job.config_file`` TOML, then CLI overrides.

    ``argv`` defaults to ``sys.argv[1:]``. ``-h``/``--help`` prints every field and
    exits. Raises ConfigError for any invalid input.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(help_text())
        raise SystemExit(0)

    overrides = _parse_argv(argv)
    cfg = JobConfig()
    provenance: dict[tuple[str, str], str] = {}

    config_file = ""
    for flag, key, value in overrides:
        if key == "job.config_file":
            if not value:
                raise ConfigError(f"command line ({flag}): --job.config_file needs a path")
            config_file = value
    if config_file:
        data, lines = read_toml(config_file, ConfigError, "config file")
        _apply_toml(cfg, config_file, data, lines, provenance)

    _apply_cli(cfg, overrides, provenance)
    cfg.job.config_file = config_file
    _check_ranges(cfg, provenance)
    _one_micro_batch_size(cfg, provenance)
    _fault_tolerance(cfg, provenance, os.environ)
    cfg.provenance = provenance
    return cfg


def _fault_tolerance(
    cfg: JobConfig, provenance: dict[tuple[str, str], str], environ: Mapping[str, str]
) -> None:
    """Fill `replica_id` and `lighthouse` from FT_REPLICA_ID / FT_LIGHTHOUSE when unset
    (run_train.sh passes them so one command starts any group), then check that the
    settings fit together."""
    ft = cfg.fault_tolerance
    if not ft.enable:
        return

    def where(name: str) -> str:
        return provenance.get(("fault_tolerance", name), "default")

    if ft.replica_id == -1 and environ.get("FT_REPLICA_ID", "") != "":
        raw = environ["FT_REPLICA_ID"]
        if not raw.isdigit():
            raise ConfigError(
                f"FT_REPLICA_ID={raw!r} is invalid: expected this replica group's id, "
                f"an integer in [0, {ft.group_count})"
            )
        ft.replica_id = int(raw)
        provenance[("fault_tolerance", "replica_id")] = "environment (FT_REPLICA_ID)"
    if not ft.lighthouse and environ.get("FT_LIGHTHOUSE"):
        ft.lighthouse = environ["FT_LIGHTHOUSE"]
        provenance[("fault_tolerance", "lighthouse")] = "environment (FT_LIGHTHOUSE)"
    if not 0 <= ft.replica_id < ft.group_count:
        raise ConfigError(
            f"{where('replica_id')}: [fault_tolerance] replica_id = {ft.replica_id} is "
            f"invalid: expected an integer in [0, group_count = {ft.group_count}) (set it, or "
            "FT_REPLICA_ID, for each replica group)"
        )
    if ft.min_replicas > ft.group_count:
        raise ConfigError(
            f"{where('min_replicas')}: [fault_tolerance] min_replicas = {ft.min_replicas} is "
            f"invalid: expected at most group_count = {ft.group_count}"
        )
    host, _, port = ft.lighthouse.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"{where('lighthouse')}: [fault_tolerance] lighthouse = {ft.lighthouse!r} is "
            "invalid: expected host:port of the lighthouse (or FT_LIGHTHOUSE)"
        )
    if cfg.data.loader != "zephon":
        raise ConfigError(
            f"{provenance.get(('data', 'loader'), 'default')}: [data] loader = "
            f"{cfg.data.loader!r} with fault tolerance: expected 'zephon' (only its lanes "
            "can be dealt over the groups alive at each step; the hf baseline cannot)"
        )
    if cfg.parallelism.pipeline_parallel_degree > 1:
        raise ConfigError(
            "[parallelism] pipeline_parallel_degree > 1 with fault tolerance: expected 1 "
            "(pipeline stages inside a replica group are not supported yet)"
        )
    if importlib.util.find_spec("torchft") is None:
        raise ConfigError(
            "[fault_tolerance] enable = true needs torchft, which is not installed: "
            "pip install -e '.[ft]' (see docs/fault_tolerance.md)"
        )


def _one_micro_batch_size(cfg: JobConfig, provenance: dict[tuple[str, str], str]) -> None:
    """training.local_batch_size and local_batch_tokens are two ways to say one thing:
    both from the same place is an error; across places the command line wins."""
    rows, tokens = ("training", "local_batch_size"), ("training", "local_batch_tokens")
    if rows not in provenance or tokens not in provenance or not cfg.training.local_batch_tokens:
        return
    rows_cli, tokens_cli = (provenance[k].startswith("command line") for k in (rows, tokens))
    if rows_cli == tokens_cli:
        raise ConfigError(
            f"{provenance[tokens]}: [training] local_batch_tokens = "
            f"{cfg.training.local_batch_tokens} and local_batch_size = "
            f"{cfg.training.local_batch_size} ({provenance[rows]}) both set the micro-batch; "
            "set one of them"
        )
    if tokens_cli:  # the command line's tokens replace the config file's rows
        cfg.training.local_batch_size = Training.local_batch_size
        del provenance[rows]
    else:
        cfg.training.local_batch_tokens = 0
        del provenance[tokens]


def to_toml(cfg: JobConfig) -> str:
    """Render the config as TOML that ``load_job_config`` reads back unchanged."""
    out: list[str] = []
    for section, values in cfg.to_dict().items():
        out.append(f"[{section}]")
        for name, value in values.items():
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, str):
                text = json.dumps(value)  # JSON string escapes are valid TOML
            else:
                text = repr(value)
            out.append(f"{name} = {text}")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = load_job_config(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(to_toml(cfg), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
