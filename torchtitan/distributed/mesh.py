"""The device mesh: (data-parallel replicate, data-parallel shard, tensor parallel).

Ranks are laid out with tensor parallelism innermost, so TP peers are
neighbouring ranks (the same node), and the replicate dimension outermost
(HSDP replicas across node groups). The two data-parallel dimensions are also
flattened into one `dp` dimension: its coordinate and size are what Zephon
calls the data-parallel rank and size, so the lanes a rank reads never depend
on how data parallelism is split between replicas and shards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from torchtitan.config.job_config import ConfigError, Parallelism


@dataclass(frozen=True)
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    tp: int
    world_size: int

    @property
    def dp(self) -> int:
        """Data-parallel size: the number of distinct batches per step."""
        return self.dp_replicate * self.dp_shard

    @classmethod
    def from_config(cls, p: Parallelism, world_size: int, nodes: int = 1) -> ParallelDims:
        """Resolve `data_parallel_replicate_degree = -1` (one replica per node: `nodes`,
        the launch's node count, which an elastic restart may change) and
        `data_parallel_shard_degree = -1`, and check the product is the world."""
        rep, shard, tp = (
            p.data_parallel_replicate_degree,
            p.data_parallel_shard_degree,
            p.tensor_parallel_degree,
        )
        if rep == -1:
            rep = nodes
            if world_size % (rep * tp):
                raise ConfigError(
                    f"parallelism: data_parallel_replicate_degree = -1 asks for one replica per "
                    f"node, but {world_size} processes on {nodes} node(s) x "
                    f"tensor_parallel_degree {tp} do not split evenly; launch the same number "
                    "of processes on every node, a multiple of the tensor-parallel degree"
                )
        if shard == -1:
            if world_size % (rep * tp):
                raise ConfigError(
                    f"parallelism: {world_size} processes cannot be split into "
                    f"data_parallel_replicate_degree {rep} x tensor_parallel_degree {tp} x a "
                    "whole data_parallel_shard_degree; launch a multiple of "
                    f"{rep * tp} processes or change the degrees"
                )
            shard = world_size // (rep * tp)
        if rep * shard * tp != world_size:
            raise ConfigError(
                f"parallelism: data_parallel_replicate_degree {rep} x data_parallel_shard_degree "
                f"{shard} x tensor_parallel_degree {tp} = {rep * shard * tp}, but {world_size} "
                "processes were launched; the product must equal the number of processes "
                "(set data_parallel_shard_degree = -1 to use the rest)"
            )
        return cls(rep, shard, tp, world_size)


class ParallelMesh:
    """The world mesh and the views of it that the trainer uses."""

    def __init__(self, dims: ParallelDims, device_type: str):
        self.dims = dims
        names, shape = [], []
        for name, size in (("dp_replicate", dims.dp_replicate), ("dp_shard", dims.dp_shard)):
            names.append(name)
            shape.append(size)
        if dims.tp > 1:
            names.append("tp")
            shape.append(dims.tp)
        self.world = init_device_mesh(device_type, tuple(shape), mesh_dim_names=tuple(names))
        dp_dims = ("dp_replicate", "dp_shard")
        self.dp = self.world[dp_dims]._flatten("dp")
        # FSDP: a 1-D shard mesh, or the 2-D (replicate, shard) mesh for HSDP.
        self.fsdp = self.world[dp_dims] if dims.dp_replicate > 1 else self.world["dp_shard"]
        self.tp: DeviceMesh | None = self.world["tp"] if dims.tp > 1 else None

    @property
    def dp_rank(self) -> int:
        return self.dp.get_local_rank()

    @property
    def dp_size(self) -> int:
        return self.dims.dp

    @property
    def dp_group(self) -> dist.ProcessGroup:
        return self.dp.get_group()

    @property
    def tp_group(self) -> dist.ProcessGroup | None:
        return self.tp.get_group() if self.tp is not None else None

    def describe(self) -> str:
        d = self.dims
        return (
            f"mesh dp_replicate {d.dp_replicate} x dp_shard {d.dp_shard} x tp {d.tp} "
            f"(data-parallel size {d.dp})"
        )
