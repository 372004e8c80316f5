"""The loader glue runs its collectives for any implementation of the loader
contract, including ranks that contribute different numbers of digests: a 3-process
gloo group (the adapters themselves are tests/unit/trainer/test_loader_contract.py)."""

from __future__ import annotations

import datetime
import hashlib
import json
import multiprocessing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from helpers.spawned import leave_process_group

from torchtitan.datasets.dataloader import TrainDataLoader, gather_digests
from zephon import global_batch_digest

COUNTS = (2, 0, 3)  # digests per rank: uneven, one rank with none


def _digests(rank: int, n: int) -> list[bytes]:
    return [hashlib.sha256(f"rank {rank} unit {i}".encode()).digest() for i in range(n)]


@dataclass
class FakeBatch:
    step: int
    digests: list[bytes]

    def num_valid_tokens(self) -> int:
        return 0

    def micro_batches(self, rows: int) -> list[Any]:
        return []


@dataclass
class FakeLoader:
    """Any implementation of the contract: the glue must not care which."""

    rank: int
    digests: list[bytes] = field(default_factory=list)
    # Per coming batch: whether it starts a lane-count change (needs merged state).
    lane_changes: list[bool] = field(default_factory=list)
    loaded: list[dict[str, Any]] = field(default_factory=list)
    state_calls: int = 0

    @property
    def source_names(self) -> tuple[str, ...]:
        return ("only",)

    def next_batch(self) -> FakeBatch | None:
        if self.lane_changes:
            self.lane_changes.pop(0)
        return FakeBatch(step=5, digests=self.digests)

    def needs_merged_state(self) -> bool:
        return bool(self.lane_changes) and self.lane_changes[0]

    def state_dict(self) -> dict[str, Any]:
        self.state_calls += 1
        return {"rank": self.rank}

    def merge_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        return {"merged": states}

    def check_resumable(self, doc: dict[str, Any]) -> None:
        pass

    def load_state(self, doc: dict[str, Any]) -> None:
        self.loaded.append(doc)

    def dropped_records(self) -> int | None:
        return self.rank + 1

    def close(self) -> None:
        pass


def _rank_main(rank: int, world: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    result: dict[str, Any] = {}
    try:
        mine = _digests(rank, COUNTS[rank])
        cpu = torch.device("cpu")
        result["parts"] = [[d.hex() for d in p] for p in gather_digests(mine, None, cpu)]
        glue = TrainDataLoader(FakeLoader(rank, mine), dp_size=world)
        batch = glue.next_batch()
        assert batch is not None
        result["global"] = glue.global_digest(batch)
        result["state"] = glue.gather_state()
        result["dropped"] = glue.bad_records_dropped()
        # Lane-count changes before the 1st and 3rd batch: every rank loads the merged
        # state; the 1st reuses the boundary checkpoint's gather, the 3rd gathers.
        change = FakeLoader(rank, mine, lane_changes=[True, False, True])
        glue = TrainDataLoader(change, dp_size=world)
        glue.gather_state()  # the boundary checkpoint
        for _ in range(3):
            glue.next_batch()
        result["handoff"] = {"loaded": change.loaded, "state_calls": change.state_calls}
        # The same three processes as tensor-parallel peers of one data-parallel
        # rank: equal digests pass, one peer with a digest fewer is caught.
        singles = [dist.new_group([r]) for r in range(world)]
        peers = TrainDataLoader(
            FakeLoader(rank), dp_size=1, dp_group=singles[rank], coordinate_group=dist.group.WORLD
        )
        result["tp_equal"] = peers.global_digest(FakeBatch(5, _digests(0, 3)))
        try:
            peers.global_digest(FakeBatch(5, _digests(0, 2 if rank == 2 else 3)))
            result["tp_unequal"] = None
        except RuntimeError as exc:
            result["tp_unequal"] = str(exc)
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        leave_process_group()


def test_glue_collectives_with_a_different_number_of_digests_per_rank(tmp_path):
    world = len(COUNTS)
    ctx = multiprocessing.get_context("spawn")
    init_file = tmp_path / "store"
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, str(init_file), str(tmp_path)))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        if p.exitcode is None:
            p.kill()
    assert [p.exitcode for p in procs] == [0] * world
    expected = [_digests(r, n) for r, n in enumerate(COUNTS)]
    flat = [d for part in expected for d in part]
    for rank in range(world):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["parts"] == [[d.hex() for d in part] for part in expected]
        assert got["global"] == global_batch_digest(flat)
        assert got["state"] == {"merged": [{"rank": r} for r in range(world)]}
        assert got["dropped"] == sum(r + 1 for r in range(world))
        merged = {"merged": [{"rank": r} for r in range(world)]}
        assert got["handoff"] == {"loaded": [merged, merged], "state_calls": 2}
        assert got["tp_equal"] == global_batch_digest(_digests(0, 3))
        assert (
            "the processes of one data-parallel coordinate received different batches at step 5"
            in (got["tp_unequal"] or "")
        )
