"""Pipeline settings are checked before anything is built: the mesh order and
degrees, the schedule's name, its stages per rank and the micro-batches of every
phase, each bad input one clear message."""

from __future__ import annotations

import pytest

from torchtitan.config.job_config import ConfigError, Parallelism, load_job_config
from torchtitan.distributed.mesh import ParallelDims
from torchtitan.distributed.pipeline import check_pipeline, stage_ids, stages_per_rank


def pipeline(pp: int = 2, schedule: str = "1F1B", mb: int = 1, v: int = 0) -> Parallelism:
    return Parallelism(
        pipeline_parallel_degree=pp, pipeline_parallel_schedule=schedule,
        pipeline_parallel_microbatch_size=mb, pipeline_parallel_stages_per_rank=v,
    )  # fmt: skip


def test_the_pipeline_is_outermost_and_data_parallelism_takes_the_rest():
    d = ParallelDims.from_config(pipeline(pp=2), 8)
    assert (d.pp, d.dp_replicate, d.dp_shard, d.tp, d.dp) == (2, 1, 4, 1, 4)
    assert d.coordinate_size == 2 and d.world_size == 8
    p = pipeline(pp=2)
    p.tensor_parallel_degree = 2
    d = ParallelDims.from_config(p, 8)
    assert (d.dp, d.coordinate_size) == (2, 4)
    with pytest.raises(ConfigError, match="pipeline_parallel_degree 3 does not divide the 8"):
        ParallelDims.from_config(pipeline(pp=3), 8)


def test_stages_per_rank_follow_the_schedule():
    assert stages_per_rank(pipeline(schedule="1F1B")) == 1
    assert stages_per_rank(pipeline(schedule="Interleaved1F1B")) == 2
    assert stages_per_rank(pipeline(schedule="Interleaved1F1B", v=3)) == 3
    # Interleaved: rank r runs r, r + pp, ...
    assert stage_ids(pipeline(pp=2, schedule="Interleaved1F1B"), 1) == [1, 3]
    assert stage_ids(pipeline(pp=4), 2) == [2]


def test_micro_batches_must_cut_every_phase_and_fill_the_pipeline():
    check_pipeline(pipeline(pp=2, mb=2), {"ramp": 4, "main": 8})
    with pytest.raises(ConfigError) as exc:
        check_pipeline(pipeline(pp=4, mb=2), {"ramp": 4, "main": 10, "anneal": 7})
    msg = str(exc.value)
    assert (
        "ramp: 4 rows per data-parallel rank give 2 micro-batch(es) of 2 rows, fewer than "
        "the 4 pipeline ranks" in msg
    )
    assert "anneal: 7 rows per data-parallel rank do not split into micro-batches of 2" in msg
    assert "main" not in msg.replace("pipeline_parallel_microbatch_size", "")
    with pytest.raises(ConfigError, match="give 3 micro-batches, not a multiple of the 2"):
        check_pipeline(pipeline(pp=2, schedule="Interleaved1F1B"), {"data": 3})
    with pytest.raises(ConfigError, match="1F1B runs one stage per rank, not .* 2"):
        check_pipeline(pipeline(pp=2, v=2), {"data": 8})


def test_schedule_names_are_checked_with_the_closest_valid_one():
    with pytest.raises(ConfigError, match="did you mean 'Interleaved1F1B'"):
        load_job_config(["--parallelism.pipeline_parallel_schedule", "interleaved_1f1b"])
    with pytest.raises(ConfigError, match="zero-bubble schedules gave other gradients"):
        load_job_config(["--parallelism.pipeline_parallel_schedule", "ZBVZeroBubble"])
    with pytest.raises(ConfigError, match="pipeline_parallel_microbatch_size = 0 is invalid"):
        load_job_config(["--parallelism.pipeline_parallel_microbatch_size", "0"])
