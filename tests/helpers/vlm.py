"""A tiny vision-language model, batches with images, and the worker of the
multi-process tests (imported by spawned processes, so kept free of pytest)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from torchtitan.config.job_config import Parallelism, Training
from torchtitan.distributed.mesh import ParallelDims, ParallelMesh
from torchtitan.distributed.utils import exit_process
from torchtitan.models.vlm.args import VisionArgs, VLMArgs, get_model_args
from torchtitan.models.vlm.model import VisionLanguageModel
from torchtitan.models.vlm.spec import SPEC
from zephon.batch import IGNORE_INDEX, Batch
from zephon.images.batch import ImageBatch

VOCAB = 61  # + 3 image tokens = 64
PATCH, MERGE = 4, 2
SEQ = 24


def tiny_args(**overrides: object) -> VLMArgs:
    vision = VisionArgs(patch_size=PATCH, merge=MERGE, dim=16, n_layers=2, n_heads=2,
                        ffn_hidden_dim=32)  # fmt: skip
    fields = dict(dim=32, n_layers=2, n_heads=2, n_kv_heads=2, multiple_of=16, max_seq_len=64)
    return get_model_args("debugmodel", vocab_size=VOCAB, vision=vision, **{**fields, **overrides})


def tiny_model(seed: int = 0, **overrides: object) -> VisionLanguageModel:
    model = VisionLanguageModel(tiny_args(**overrides))
    model.init_weights(torch.Generator().manual_seed(seed))
    return model


def random_patches(grids: list[tuple[int, int]], seed: int) -> np.ndarray:
    n = sum(h * w for h, w in grids)
    return np.random.default_rng(seed).integers(0, 256, (n, 3 * PATCH * PATCH), dtype=np.uint8)


def images(
    grids: list[tuple[int, int]], rows: list[int], starts: list[int], seed: int = 0
) -> ImageBatch:
    return ImageBatch.from_numpy(
        random_patches(grids, seed), np.array(grids), np.array(rows), np.array(starts), PATCH, MERGE
    )


def rank_batch(rank: int, rows: int = 6) -> Batch:
    """Rank 0: rows with images (two in row 0, one in row 1, one in row 3, none
    after); rank 1: text only, its last row padding (labels all ignored)."""
    gen = torch.Generator().manual_seed(100 + rank)
    tokens = torch.randint(0, VOCAB, (rows, SEQ + 1), generator=gen)
    positions = torch.arange(SEQ).repeat(rows, 1)
    positions[:, 13:] -= 13  # a second document in every row
    labels = tokens[:, 1:].clone()
    imgs, padded = None, 0
    if rank == 0:
        imgs = images([(2, 4), (2, 2), (4, 4), (2, 2)], [0, 0, 1, 3], [2, 9, 5, 20], seed=rank)
        for r, s, n in ((0, 2, 2), (0, 9, 1), (1, 5, 4), (3, 20, 1)):
            labels[r, s - 1 : s + n - 1] = IGNORE_INDEX  # the loader ignores them
    else:
        labels[-1] = IGNORE_INDEX
        padded = 1
    return Batch(0, tokens[:, :-1], labels, positions, [], num_padded_rows=padded, images=imgs)


def loss_sum(model: torch.nn.Module, mb: Batch) -> torch.Tensor:
    logits = model(**SPEC.inputs(mb, torch.device("cpu")))
    return torch.nn.functional.cross_entropy(
        logits.flatten(0, 1).float(), mb.labels.flatten(), ignore_index=IGNORE_INDEX,
        reduction="sum",
    )  # fmt: skip


def accumulate(model: torch.nn.Module, batches: list[Batch], scale: float, micro: int) -> None:
    for batch in batches:
        for mb in batch.micro_batches(micro):
            (loss_sum(model, mb) * scale).backward()


def valid_tokens(world: int) -> int:
    return sum(rank_batch(r).num_valid_tokens() for r in range(world))


def distributed_worker(rank: int, world: int, init_file: str, out: str, tp: int) -> None:
    """One rank: the tiny model on FSDP (x TP), this rank's micro-steps as the trainer
    runs them (loss scaled by dp / global valid tokens), full gradients saved by rank 0."""
    torch.set_num_threads(1)  # forked from pytest: never enter its OpenMP pool
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    dims = ParallelDims.from_config(Parallelism(tensor_parallel_degree=tp), world)
    mesh = ParallelMesh(dims, "cpu")
    with torch.device("meta"):
        model = VisionLanguageModel(tiny_args())
    SPEC.parallelize(model, mesh, Training(mixed_precision_param="float32"))
    model.to_empty(device="cpu")
    model.init_weights(torch.Generator().manual_seed(0))
    accumulate(model, [rank_batch(mesh.dp_rank)], dims.dp / valid_tokens(dims.dp), micro=2)
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    if rank == 0:
        torch.save(grads, Path(out) / "grads.pt")
    # Tearing down gloo after FSDP2 work can crash a rank (SIGSEGV, seen in CI):
    # meet at a barrier, then leave without the teardown.
    exit_process(0)
