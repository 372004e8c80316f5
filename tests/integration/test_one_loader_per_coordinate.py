"""One loader per data-parallel coordinate: tensor-parallel peers share the loader
of their TP rank 0, which broadcasts each batch to the others (pipeline stages
likewise: tests/integration/trainer/test_pipeline_parallel.py).

Proved by counting work, not time: a TP 2 x FSDP 2 job (4 processes) runs 2
loaders and tokenizes exactly the tokens that FSDP 2 alone tokenizes (every peer
loading would tokenize twice as many), trains on the same global batches, and
saves the same loader state. In process, on a 2-rank gloo group: a receiver gets
every field of an image-text batch (patches, grids, per-source counts), the end
of the data and the loading peer's error; and the digest check of the glue
catches a receiver whose batch lost a field.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import REPO
from helpers.spawned import leave_process_group
from helpers.train import ensure_sample_data, metrics, ok, torchrun, torchrun_train

from torchtitan.datasets.coordinate_loader import batch_digest, one_loader_per_coordinate
from torchtitan.datasets.dataloader import TrainDataLoader
from zephon import DataError

pytestmark = pytest.mark.slow

TP = ["--parallelism.tensor_parallel_degree", "2"]
# Inline loading (no worker or prefetch thread): the work counts are exact, so the
# two runs' counts can be compared for equality.
INLINE = ["--data.num_workers", "0", "--data.prefetch", "0", "--training.steps", "3"]
WORK = re.compile(
    r"data loading work: (\d+) loader\(s\) on (\d+) process\(es\): "
    r"tokens_tokenized ([\d,]+), docs_tokenized ([\d,]+), images_decoded ([\d,]+)"
)


def work(stdout: str) -> dict[str, int]:
    found = WORK.findall(stdout)
    assert len(found) == 1, stdout[-3000:]
    names = ("loaders", "processes", "tokens_tokenized", "docs_tokenized", "images_decoded")
    return {k: int(v.replace(",", "")) for k, v in zip(names, found[0], strict=True)}


def test_tp_peers_load_once_and_train_on_the_same_bytes(tmp_path):
    ensure_sample_data()
    fsdp = ok(torchrun(2, tmp_path / "fsdp", *INLINE))
    tp = ok(torchrun(4, tmp_path / "tp", *INLINE, *TP))
    assert "dp_shard 2 x tp 2 (data-parallel size 2)" in tp.stdout
    alone, shared = work(fsdp.stdout), work(tp.stdout)
    # The 4 processes tokenize the same documents and tokens as FSDP 2 alone (every
    # TP peer loading would tokenize each twice)...
    assert alone["tokens_tokenized"] > 0
    assert shared["tokens_tokenized"] == alone["tokens_tokenized"]
    assert shared["docs_tokenized"] == alone["docs_tokenized"]
    # ...as 2 loaders, one per data-parallel coordinate, like FSDP 2's.
    assert alone["loaders"] == 2 and alone["processes"] == 2
    assert shared["loaders"] == 2 and shared["processes"] == 4
    assert "batches broadcast to 2 receiving peer(s)" in tp.stdout
    # The same global batches at every step (logged at every step here).
    ref, got = metrics(tmp_path / "fsdp"), metrics(tmp_path / "tp")
    assert sorted(got) == sorted(ref) == [1, 2, 3]
    for step in ref:
        assert got[step]["digest"] == ref[step]["digest"], step
        assert got[step]["source_tokens"] == ref[step]["source_tokens"], step
    # The loader state is saved once per coordinate: the same document as FSDP 2's.
    saved = [json.loads((tmp_path / run / "checkpoint" / "step-3" / "dataloader.json").read_text())
             for run in ("fsdp", "tp")]  # fmt: skip
    assert saved[0]["dp_size"] == 2 and saved[1] == saved[0]


def test_tp_peers_of_the_vlm_decode_each_image_once(tmp_path):
    """The image-text model on TP 2 (one data-parallel coordinate of 2 processes)
    decodes and tokenizes exactly what one process alone does, on the same batches."""
    ensure_sample_data()
    vlm = ["--job.config_file", str(REPO / "train_configs" / "vlm_debugmodel.toml"),
           "--training.steps", "2", "--data.num_workers", "0", "--data.prefetch", "0",
           "--checkpoint.enable", "false", "--validation.enable", "false",
           "--data.log_batch_digests", "true", "--metrics.log_freq", "1",
           "--training.global_batch_size", "8"]  # fmt: skip
    # (8 rows: one a lane, every lane's images decoded, a quarter of the config's work)
    alone = ok(torchrun_train(1, tmp_path / "one", vlm, timeout=600))
    tp = ok(torchrun_train(2, tmp_path / "tp", [*vlm, *TP], timeout=600))
    one, shared = work(alone.stdout), work(tp.stdout)
    assert one["images_decoded"] > 0 and one["loaders"] == 1
    assert shared["loaders"] == 1 and shared["processes"] == 2
    assert shared["images_decoded"] == one["images_decoded"]
    assert shared["tokens_tokenized"] == one["tokens_tokenized"]
    ref, got = metrics(tmp_path / "one"), metrics(tmp_path / "tp")
    assert [got[s]["digest"] for s in (1, 2)] == [ref[s]["digest"] for s in (1, 2)]


# -- the broadcast, in process ----------------------------------------------------------


def image_text_batch(step: int) -> Any:
    """A batch as the vlm loader makes it: token rows, images, per-source counts."""
    from helpers.vlm import rank_batch

    batch = rank_batch(0)
    batch.step = step
    batch.digests = [bytes([step]) * 32, bytes([step + 1]) * 32]
    batch.source_tokens = np.array([100 + step, 7], dtype=np.int64)
    batch.source_docs = np.array([3, 1], dtype=np.int64)
    batch.source_names = ("captions", "interleaved")
    batch.phase = "main"
    batch.padded_to = 8
    return batch


@dataclass
class ImageLoader:
    """Two image-text batches, then a bad record."""

    calls: int = 0
    source_names: tuple[str, ...] = ("captions", "interleaved")
    work: dict[str, int] = field(default_factory=lambda: {"tokens_tokenized": 5})

    def next_batch(self) -> Any:
        self.calls += 1
        if self.calls == 3:
            raise DataError("captions/part-0.tar: a bad record at member 7")
        return image_text_batch(self.calls)

    def needs_merged_state(self) -> bool:
        return False

    def work_done(self) -> dict[str, int]:
        return self.work

    def close(self) -> None:
        pass


def _describe(batch: Any) -> dict[str, Any]:
    """Every field of a batch, tensors and arrays as lists (for JSON)."""
    img = batch.images
    return {
        "step": batch.step,
        "digests": [d.hex() for d in batch.digests],
        "tensors": {k: getattr(batch, k).tolist() for k in ("input_ids", "labels", "positions")},
        "images": img
        and {k: getattr(img, k).tolist() for k in ("patches", "grids", "rows", "starts")},
        "image_sizes": img and [img.patch_size, img.merge],
        "counts": [batch.source_tokens.tolist(), batch.source_docs.tolist()],
        "plain": [list(batch.source_names), batch.phase, batch.num_padded_rows, batch.padded_to],
        "digest": batch_digest(batch).hex(),
    }


def _peer_main(rank: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    result: dict[str, Any] = {}
    try:
        cpu = torch.device("cpu")
        peer = one_loader_per_coordinate(ImageLoader, dist.group.WORLD, cpu)
        result["kind"] = type(peer).__name__
        result["names"] = list(peer.source_names)
        singles = [dist.new_group([r]) for r in range(2)]
        glue = TrainDataLoader(
            peer, dp_size=1, dp_group=singles[rank], coordinate_group=dist.group.WORLD
        )
        first = glue.next_batch()
        result["batch"] = _describe(first)
        result["global"] = glue.global_digest(first)
        second = glue.next_batch()
        if rank == 1:
            second.images = None  # a receiver that lost a field
        try:
            glue.global_digest(second)
            result["lost_field"] = None
        except RuntimeError as exc:
            result["lost_field"] = str(exc)
        try:
            glue.next_batch()
        except DataError as exc:
            result["error"] = [type(exc).__name__, str(exc)]
        result["work"] = peer.work_done()
    finally:
        Path(out, f"peer{rank}.json").write_text(json.dumps(result))
        leave_process_group()


def test_a_receiver_gets_every_field_and_the_loading_peers_error(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    init_file = tmp_path / "store"
    procs = [ctx.Process(target=_peer_main, args=(r, str(init_file), str(tmp_path)))
             for r in range(2)]  # fmt: skip
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.exitcode is None:
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    sender, receiver = (json.loads((tmp_path / f"peer{r}.json").read_text()) for r in range(2))
    assert [sender["kind"], receiver["kind"]] == ["LoadingPeer", "ReceivingPeer"]
    assert receiver["names"] == ["captions", "interleaved"]
    expected = _describe(image_text_batch(1))
    assert sender["batch"] == expected
    assert receiver["batch"] == expected  # every field, the images' pixels included
    assert receiver["global"] == sender["global"]
    for side in (sender, receiver):
        assert (
            "the processes of one data-parallel coordinate received different batches at step 2"
            in side["lost_field"]
        )
        assert side["error"] == ["DataError", "captions/part-0.tar: a bad record at member 7"]
    assert sender["work"]["tokens_tokenized"] == 5 and sender["work"]["broadcast_batches"] == 2
    assert receiver["work"] == {"receivers": 1, "received_bytes": sender["work"]["broadcast_bytes"]}


def test_batch_digest_sees_every_field():
    batch = image_text_batch(1)
    base = batch_digest(batch)
    assert batch_digest(image_text_batch(1)) == base
    changes = {
        "labels": lambda b: b.labels.__setitem__((0, 0), b.labels[0, 0] + 1),
        "patches": lambda b: b.images.patches.__setitem__((0, 0), b.images.patches[0, 0] ^ 1),
        "grids": lambda b: setattr(b.images, "grids", b.images.grids.flip(0)),
        "source_tokens": lambda b: b.source_tokens.__setitem__(1, 8),
        "digests": lambda b: b.digests.pop(),
        "phase": lambda b: setattr(b, "phase", "other"),
        "positions dtype": lambda b: setattr(b, "positions", b.positions.int()),
    }
    for name, change in changes.items():
        other = image_text_batch(1)
        change(other)
        assert batch_digest(other) != base, name
