"""The mesh degrees are checked at start-up, one clear message per bad combination."""

from __future__ import annotations

import pytest

from torchtitan.config.job_config import ConfigError, Parallelism, load_job_config
from torchtitan.distributed.mesh import ParallelDims
from torchtitan.models.llama3.args import get_model_args
from torchtitan.models.llama3.parallelize import check_parallelism


def dims(world: int, rep: int = 1, shard: int = -1, tp: int = 1) -> ParallelDims:
    p = Parallelism(
        data_parallel_replicate_degree=rep, data_parallel_shard_degree=shard,
        tensor_parallel_degree=tp,
    )  # fmt: skip
    return ParallelDims.from_config(p, world)


def test_shard_minus_one_takes_the_rest():
    d = dims(16, rep=2, tp=2)
    assert (d.dp_replicate, d.dp_shard, d.tp, d.dp) == (2, 4, 2, 8)
    assert dims(4).dp == 4


def test_product_must_equal_the_world():
    with pytest.raises(ConfigError, match=r"2 x data_parallel_shard_degree 4 x .* = 8, but 4"):
        dims(4, rep=2, shard=4)


def test_rest_must_be_whole():
    with pytest.raises(ConfigError, match="6 processes cannot be split"):
        dims(6, rep=2, tp=2)


def test_tensor_parallel_checks_the_model_shape():
    args = get_model_args("debugmodel")  # 4 heads, 2 kv heads
    check_parallelism(args, dims(8, tp=2), seq_len=64)
    with pytest.raises(ConfigError) as exc:
        check_parallelism(args, dims(4, tp=4), seq_len=66)
    msg = str(exc.value)
    assert "n_kv_heads 2 is not divisible" in msg and "seq_len 66" in msg
    assert "n_heads 4" not in msg
    with pytest.raises(ConfigError, match="ties its output projection"):
        check_parallelism(get_model_args("1B"), dims(2, tp=2), seq_len=2048)


def test_degrees_are_range_checked():
    with pytest.raises(ConfigError, match=r"tensor_parallel_degree = 0 is invalid"):
        load_job_config(["--parallelism.tensor_parallel_degree", "0"])
    # -1 is one replica per node (tests/unit/trainer/test_unattended.py); other negatives are refused.
    with pytest.raises(ConfigError, match=r"data_parallel_replicate_degree = -2 is invalid"):
        load_job_config(["--parallelism.data_parallel_replicate_degree", "-2"])
