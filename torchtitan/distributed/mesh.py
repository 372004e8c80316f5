"""The device mesh: (pipeline, data-parallel replicate, data-parallel shard,
tensor parallel).

Ranks are laid out with tensor parallelism innermost, so TP peers are
neighbouring ranks (the same node), then the data-parallel dimensions, and the
pipeline outermost (stages exchange one activation per micro-batch, the
cheapest traffic to send across nodes). The two data-parallel dimensions are
also flattened into one `dp` dimension: its coordinate and size are what Zephon
calls the data-parallel rank and size, so the lanes a rank reads never depend
on how data parallelism is split between replicas and shards.

The processes that share a data-parallel coordinate (every pipeline stage and
TP peer of it) form its *coordinate group*; they train on one batch, loaded by
the group's rank 0 (stage 0, TP rank 0) and broadcast to the others.
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
    pp: int = 1
    ep: int = 1
    """Expert parallelism: groups of this many data-parallel ranks share the routed
    experts of a mixture-of-experts model (1: every rank computes every expert)."""

    @property
    def coordinate_size(self) -> int:
        """Processes per data-parallel coordinate (pipeline stages x TP peers): how
        many hold each batch."""
        return self.pp * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel size: the number of distinct batches per step."""
        return self.dp_replicate * self.dp_shard

    @classmethod
    def from_config(cls, p: Parallelism, world_size: int, nodes: int = 1) -> ParallelDims:
        """Resolve `data_parallel_replicate_degree = -1` (one replica per node: `nodes`,
        the launch's node count, which an elastic restart may change) and
        `data_parallel_shard_degree = -1`, and check the product is the world."""
        rep, shard, tp, pp = (
            p.data_parallel_replicate_degree,
            p.data_parallel_shard_degree,
            p.tensor_parallel_degree,
            p.pipeline_parallel_degree,
        )
        if pp < 1 or tp < 1:
            raise ConfigError(
                f"parallelism: pipeline_parallel_degree {pp} and tensor_parallel_degree {tp} "
                "must each be at least 1"
            )
        if world_size % pp:
            raise ConfigError(
                f"parallelism: pipeline_parallel_degree {pp} does not divide the {world_size} "
                "processes launched; launch a multiple of it"
            )
        # The pipeline is outermost: the other degrees split the processes of one stage.
        world_size //= pp
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
                f"parallelism: pipeline_parallel_degree {pp} x data_parallel_replicate_degree "
                f"{rep} x data_parallel_shard_degree {shard} x tensor_parallel_degree {tp} = "
                f"{pp * rep * shard * tp}, but {world_size * pp} processes were launched; the "
                "product must equal the number of processes (set data_parallel_shard_degree "
                "= -1 to use the rest)"
            )
        ep = p.expert_parallel_degree
        where = f"parallelism.expert_parallel_degree = {ep}"
        if ep > rep * shard:
            raise ConfigError(
                f"{where} is larger than the data-parallel size {rep * shard}: expected a "
                "divisor of it (experts are split over data-parallel ranks)"
            )
        if (rep * shard) % ep:
            raise ConfigError(f"{where} does not divide the data-parallel size {rep * shard}")
        if ep > 1 and (rep > 1 or tp > 1 or pp > 1):
            raise ConfigError(
                f"{where} with HSDP replicas, tensor or pipeline parallelism is not supported "
                "yet: expected data_parallel_replicate_degree, tensor_parallel_degree and "
                "pipeline_parallel_degree of 1"
            )
        return cls(rep, shard, tp, world_size * pp, pp, ep)


class ParallelMesh:
    """The world mesh and the views of it that the trainer uses."""

    def __init__(self, dims: ParallelDims, device_type: str):
        self.dims = dims
        names, shape = [], []
        if dims.pp > 1:
            names.append("pp")
            shape.append(dims.pp)
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
        self.pp: DeviceMesh | None = self.world["pp"] if dims.pp > 1 else None
        # The coordinate group (stages x TP peers, pipeline-major: its rank 0 is stage
        # 0's TP rank 0) and the group that sums a loss held by the last stage alone.
        coordinate = tuple(n for n in ("pp", "tp") if n in names)
        self.coordinate: DeviceMesh | None = None
        if len(coordinate) == 1:
            self.coordinate = self.world[coordinate[0]]
        elif coordinate:
            self.coordinate = self.world[coordinate]._flatten("coordinate")
        self.loss = self.world[("pp", *dp_dims)]._flatten("pp_dp") if self.pp else self.dp

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
    def coordinate_group(self) -> dist.ProcessGroup | None:
        """The processes of this data-parallel coordinate; None when it is one."""
        return self.coordinate.get_group() if self.coordinate is not None else None

    @property
    def pp_rank(self) -> int:
        return self.pp.get_local_rank() if self.pp is not None else 0

    @property
    def pp_group(self) -> dist.ProcessGroup | None:
        return self.pp.get_group() if self.pp is not None else None

    @property
    def loss_group(self) -> dist.ProcessGroup:
        """Sums a per-rank loss over the global batch once: the data-parallel group,
        times the stages under PP (only the last stage holds a loss)."""
        return self.loss.get_group()

    def describe(self) -> str:
        d = self.dims
        pp = f"pp {d.pp} x " if d.pp > 1 else ""
        ep = f", experts over groups of {d.ep}" if d.ep > 1 else ""
        return (
            f"mesh {pp}dp_replicate {d.dp_replicate} x dp_shard {d.dp_shard} x tp {d.tp} "
            f"(data-parallel size {d.dp}{ep})"
        )
