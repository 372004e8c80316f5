"""The trainer's startup validator: the layout, the phases still to come and their
shapes, numbers in every message (the runs that hit it end to end, and the hf
baseline's behaviour on resume, are tests/integration/test_train_validation.py)."""

from __future__ import annotations

import pytest
from helpers.train import ensure_sample_data, phase_recipe

from torchtitan.config.job_config import load_job_config
from torchtitan.datasets.dataloader import check_data_startup, check_phases, check_startup
from torchtitan.datasets.phase_timeline import DataTimeline
from zephon import LayoutError, RecipeError


def _cfg(*overrides: str):
    return load_job_config(
        ["--job.config_file", "train_configs/llama3_debugmodel.toml", *overrides]
    )


@pytest.mark.parametrize(
    ("overrides", "dp", "expected"),
    [
        (
            ["--parallelism.max_idle_share", "0.1"],
            3,
            [
                "rows per rank 8 on 1 rank, 12 on 2 ranks",
                "11.1% of the compute idles, more than the allowed 10.0%",
                "data-parallel sizes without padding: 1, 2, 4, 8",
                "parallelism.max_idle_share=0.1",
            ],
        ),
        ([], 16, ["data-parallel size 16 exceeds the lane count 8"]),
        (
            ["--training.global_batch_size", "36"],
            2,
            ["global batch size 36", "lane count 8", "32 or 40"],
        ),
        (
            ["--training.local_batch_size", "3", "--parallelism.max_idle_share", "0"],
            2,
            ["every rank runs 18 rows (6 micro-batches of 3)", "1, 2, 4, 8, 16"],
        ),
        (["--training.seq_len", "4096"], 2, ["training.seq_len 4096 exceeds", "2048"]),
    ],
)
def test_startup_validator_names_the_numbers(overrides, dp, expected):
    cfg = _cfg(*overrides)
    with pytest.raises(LayoutError) as exc:
        check_startup(cfg, dp, lanes=8, max_seq_len=2048)
    for text in expected:
        assert text in str(exc.value)


def test_uneven_size_is_reported_not_refused_by_default():
    """8 lanes on 3 ranks (2, 3 and 3 lanes of 4 rows): the smaller rank pads to the
    same 3 micro-batches of 4, and the report names the rows and the idle share."""
    layout = check_startup(_cfg(), 3, lanes=8, max_seq_len=2048)
    assert layout is not None
    assert [layout.rows_of(r) for r in range(3)] == [8, 12, 12]
    assert (layout.rows_per_rank, layout.micro_steps) == (12, 3)
    note = layout.imbalance() or ""
    assert "rows per rank 8 on 1 rank, 12 on 2 ranks" in note and "11.1%" in note


def test_hf_layout_check():
    cfg = _cfg("--data.loader", "hf", "--training.global_batch_size", "30")
    with pytest.raises(LayoutError, match="must split into 4 ranks"):
        check_startup(cfg, 4, lanes=None, max_seq_len=2048)
    # The hf baseline keeps requiring G % D where Zephon would pad.
    with pytest.raises(LayoutError, match="the hf baseline splits the global batch evenly"):
        check_startup(_cfg("--data.loader", "hf"), 3, lanes=None, max_seq_len=2048)


def _phase_plan(tmp_path, *overrides: str):
    """The tiny phase recipe (ramp 8 -> 16 rows, seq_len 32 -> 64, lanes 4 -> 8 at
    step 6) with the job's own shape agreeing with its first phase."""
    ensure_sample_data()
    recipe = phase_recipe(tmp_path)
    cfg = load_job_config(["--data.recipe", str(recipe), "--training.seq_len", "32",
                           "--training.global_batch_size", "8", *overrides])  # fmt: skip
    return cfg, DataTimeline.from_config(cfg)


def test_every_phase_still_to_come_is_checked_at_the_start_or_resume_step(tmp_path):
    """Each phase not finished at the start (or resume) step is checked for this
    data-parallel size with its own micro-batch rows and the allowed idle share;
    phases already finished are not, so a resume past a phase that does not fit
    this size is accepted."""
    cfg, plan = _phase_plan(tmp_path, "--training.local_batch_tokens", "64",
                            "--parallelism.max_idle_share", "0.2")  # fmt: skip
    layouts = check_phases(cfg, plan, 2, 0, 2048)
    assert list(layouts) == ["ramp", "main", "long", "anneal"]
    # 64 tokens per micro-batch: 2 rows of 32, then 1 row of 64.
    assert [layouts[n].micro_batch_size for n in layouts] == [2, 2, 1, 1]
    assert [layouts[n].micro_steps for n in layouts] == [2, 4, 8, 8]
    # On 3 ranks the 4-lane phases pad a third of their rows; the 8-lane one 11%.
    with pytest.raises(LayoutError) as exc:
        check_phases(cfg, plan, 3, 0, 2048)
    for text in ("phase 'ramp' (from step 0)", "33.3% of the compute idles",
                 "more than the allowed 20.0%", "training.local_batch_tokens=64",
                 "data-parallel size=3", "phases checked from step 0"):  # fmt: skip
        assert text in str(exc.value)
    with pytest.raises(LayoutError, match="phase 'long' \\(from step 4\\)"):
        check_phases(cfg, plan, 3, 4, 2048)  # resumed at the long phase's boundary
    assert list(check_phases(cfg, plan, 3, 6, 2048)) == ["anneal"]


def test_phase_shapes_are_checked_against_the_model_and_the_micro_batch(tmp_path):
    cfg, plan = _phase_plan(tmp_path)
    with pytest.raises(LayoutError) as exc:
        check_phases(cfg, plan, 2, 0, 48)
    assert "phase 'long' (from step 4): seq_len 64 exceeds the model's limit of 48" in str(
        exc.value
    )
    cfg, plan = _phase_plan(tmp_path, "--training.local_batch_tokens", "96")
    with pytest.raises(LayoutError) as exc:
        check_phases(cfg, plan, 2, 0, 2048)
    expected = "phase 'long' (from step 4): micro_batch_tokens 96 is not a whole number of rows"
    assert f"{expected} of seq_len 64" in str(exc.value)
    assert "training.local_batch_tokens=96" in str(exc.value)


def test_recipe_and_job_agree_on_the_first_phase_shape(tmp_path):
    """The recipe owns the schedule: a job value left at its default gives way to the
    first phase's; one the user set on purpose must agree, or one error names both
    and where the job's came from."""
    ensure_sample_data()
    recipe = str(phase_recipe(tmp_path))
    plan = DataTimeline.from_config(load_job_config(["--data.recipe", recipe]))
    assert (plan.phases[0].seq_len, plan.phases[0].global_batch_size) == (32, 8)
    with pytest.raises(RecipeError) as exc:
        DataTimeline.from_config(_cfg("--data.recipe", recipe, "--training.global_batch_size", "8"))
    assert "phase 'ramp' sets seq_len = 32 but the job sets seq_len = 256" in str(exc.value)
    assert "training.seq_len from config file 'train_configs/llama3_debugmodel.toml'" in str(
        exc.value
    )


def test_hf_baseline_refuses_a_phase_shape_it_would_not_follow(tmp_path):
    """The hf baseline reads the job's shape: a one-phase recipe that sets another one
    is refused rather than silently ignored."""
    ensure_sample_data()
    one = '[[phase]]\nname = "only"\nstart_step = 0\nseq_len = 32\nweights = { prose = 1.0 }\n'
    cfg = load_job_config(["--data.recipe", str(phase_recipe(tmp_path, one)),
                           "--data.loader", "hf"])  # fmt: skip
    with pytest.raises(LayoutError) as exc:
        check_data_startup(cfg, 2, 2048, DataTimeline.from_config(cfg))
    assert "phase 'only' sets seq_len 32 and global batch size 32" in str(exc.value)
    assert "the job's training.seq_len 256" in str(exc.value)
