"""A mixture-of-experts setting that cannot work is one line at start naming it
(issue 43): an expert count the expert-parallel size does not divide, expert
parallelism wider than the data-parallel ranks, top-k above the expert count, and
any MoE setting on a dense model."""

from __future__ import annotations

import pytest
from helpers import REPO

from torchtitan.components.initial_load import initial_model_args
from torchtitan.config.job_config import ConfigError, Parallelism, load_job_config
from torchtitan.distributed.mesh import ParallelDims
from torchtitan.models import check_model_name, get_model_spec
from torchtitan.runtime.preflight import job_config_problem

MOE = str(REPO / "train_configs" / "moe_debugmodel.toml")
DENSE = str(REPO / "train_configs" / "llama3_debugmodel.toml")


@pytest.mark.parametrize(
    "ep, world, words",
    [
        (8, 4, "expert_parallel_degree = 8 is larger than the data-parallel size 4"),
        (3, 4, "expert_parallel_degree = 3 does not divide the data-parallel size 4"),
    ],
)
def test_expert_parallel_degree_fits_the_data_parallel_ranks(ep, world, words):
    with pytest.raises(ConfigError, match=words):
        ParallelDims.from_config(Parallelism(expert_parallel_degree=ep), world)
    with pytest.raises(ConfigError, match="HSDP replicas, tensor or pipeline"):
        ParallelDims.from_config(
            Parallelism(expert_parallel_degree=2, data_parallel_replicate_degree=2), 4
        )
    assert ParallelDims.from_config(Parallelism(expert_parallel_degree=2), 4).ep == 2


def test_the_experts_split_evenly():
    spec = get_model_spec("moe")
    six = spec.model_args("debugmodel", n_experts=6)
    with pytest.raises(ConfigError, match="the model's 6 experts are not divisible by it"):
        spec.check_parallelism(six, ParallelDims(1, 4, 1, 4, ep=4), 256)
    with pytest.raises(ConfigError, match="divisible by the data-parallel size"):
        spec.check_parallelism(six, ParallelDims(1, 4, 1, 4, ep=2), 256)
    spec.check_parallelism(spec.model_args("debugmodel"), ParallelDims(1, 4, 1, 4, ep=2), 256)


def test_top_k_above_the_expert_count_names_the_setting():
    cfg = load_job_config(["--job.config_file", MOE, "--moe.top_k", "9"])
    with pytest.raises(ConfigError) as err:
        initial_model_args(cfg, 2048)
    assert str(err.value) == "moe.top_k = 9: top_k 9: expected 1 to the expert count 8"
    assert (
        initial_model_args(
            load_job_config(["--job.config_file", MOE, "--moe.top_k", "3"]), 2048
        ).top_k
        == 3
    )


@pytest.mark.parametrize(
    "extra, setting",
    [
        (["--moe.balance", "global_aux"], "moe.balance"),
        (["--parallelism.expert_parallel_degree", "2"], "parallelism.expert_parallel_degree"),
    ],
)
def test_an_moe_setting_on_a_dense_model_is_one_line_before_start(extra, setting):
    args = ["--job.config_file", DENSE, *extra]
    with pytest.raises(
        ConfigError, match=f"^{setting} is set, but the llama3 model has no experts"
    ):
        check_model_name(load_job_config(args))
    problem = job_config_problem(True, "torchtitan.train", args)  # the launcher's check
    assert problem is not None and problem.startswith(f"{setting} is set")
    check_model_name(load_job_config(["--job.config_file", MOE, *extra]))  # fine for an MoE
