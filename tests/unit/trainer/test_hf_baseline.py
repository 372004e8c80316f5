"""Tests for the conventional per-rank baseline loader (torchtitan.datasets.hf_baseline)."""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO

from torchtitan.datasets.hf_baseline import HFBaselineLoader
from zephon.batch import IGNORE_INDEX, Batch
from zephon.digest import global_batch_digest
from zephon.errors import StateError, ZephonError
from zephon.recipe.load import load_recipe
from zephon.schema.recipe import Recipe

COMMITTED_TOKENIZER = REPO / "assets" / "tokenizer" / "tokenizer.json"
SEQ_LEN = 16
GLOBAL_BATCH = 4
WORDS = "alpha beta gamma delta river stone cloud green quick brown fox jumps over lazy dog".split()


def _docs(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    if COMMITTED_TOKENIZER.is_file():
        return str(COMMITTED_TOKENIZER)
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<|endoftext|>", "[UNK]"])
    tok.train_from_iterator(_docs(300, 7), trainer=trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def _write_recipe(root: Path, sources: list[tuple[str, int, float, str]]) -> Recipe:
    lines = ['[recipe]\nname = "tiny"\nseed = 1234\nlanes = 4\n']
    for name, ndocs, weight, on_exhausted in sources:
        with open(root / f"{name}.jsonl", "w") as f:
            for i, text in enumerate(_docs(ndocs, zlib.crc32(name.encode()))):
                f.write(json.dumps({"id": i, "body": f"{name} {text}"}) + "\n")
        lines.append(
            f'[[source]]\nname = "{name}"\npath = "{name}.jsonl"\nformat = "jsonl"\n'
            f'text_field = "body"\nweight = {weight}\non_exhausted = "{on_exhausted}"\n'
        )
    (root / "recipe.toml").write_text("\n".join(lines))
    return load_recipe(root / "recipe.toml")


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    return _write_recipe(tmp_path_factory.mktemp("corpus"), [("web", 200, 1.0, "repeat")])


@pytest.fixture
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.getbasetemp() / "hf_cache")


def _loader(recipe: Recipe, tok: str, cache: str, rank: int, size: int, **kw) -> HFBaselineLoader:
    return HFBaselineLoader(recipe, tok, SEQ_LEN, GLOBAL_BATCH, rank, size, cache_dir=cache, **kw)


def _run(loaders: list[HFBaselineLoader], steps: int) -> list[list[Batch]]:
    """Per step, each rank's batch in rank order."""
    return [[ld.next_batch() for ld in loaders] for _ in range(steps)]


def _global(step_batches: list[Batch]) -> tuple[np.ndarray, str]:
    rows = np.concatenate([b.input_ids.numpy() for b in step_batches])
    return rows, global_batch_digest([d for b in step_batches for d in b.digests])


def _same(a: Batch, b: Batch) -> bool:
    return (
        a.step == b.step
        and np.array_equal(a.input_ids.numpy(), b.input_ids.numpy())
        and np.array_equal(a.labels.numpy(), b.labels.numpy())
        and np.array_equal(a.positions.numpy(), b.positions.numpy())
        and a.digests == b.digests
    )


def test_ranks_differ_and_rows_are_well_formed(recipe, tokenizer_path, cache_dir):
    r0, r1 = (_loader(recipe, tokenizer_path, cache_dir, r, 2) for r in (0, 1))
    for step in range(3):
        a, b = r0.next_batch(), r1.next_batch()
        for batch in (a, b):
            assert batch.step == step
            assert batch.input_ids.shape == (GLOBAL_BATCH // 2, SEQ_LEN)
            assert batch.labels.shape == batch.positions.shape == batch.input_ids.shape
            assert len(batch.digests) == GLOBAL_BATCH // 2
            assert all(len(d) == 32 for d in batch.digests)
            assert (batch.labels != IGNORE_INDEX).all()  # concat packing has no padding
            # labels are the inputs shifted by one
            assert np.array_equal(batch.labels[:, :-1].numpy(), batch.input_ids[:, 1:].numpy())
            pos = batch.positions.numpy()
            assert (pos[:, 0] == 0).all()
            steps_ok = (np.diff(pos, axis=1) == 1) | (pos[:, 1:] == 0)
            assert steps_ok.all()
        assert not np.array_equal(a.input_ids.numpy(), b.input_ids.numpy())
        assert a.digests != b.digests
    # positions restart at 0 right after an end-of-document token
    eos = r0._eos_id
    batch = r0.next_batch()
    ids, pos = batch.input_ids.numpy(), batch.positions.numpy()
    after_eos = np.argwhere(ids[:, :-1] == eos)
    assert len(after_eos) > 0
    for r, c in after_eos:
        assert pos[r, c + 1] == 0


def test_resume_same_dp_size_continues_exactly(recipe, tokenizer_path, cache_dir):
    ref = _loader(recipe, tokenizer_path, cache_dir, 1, 2)
    expected = [ref.next_batch() for _ in range(8)]

    first = _loader(recipe, tokenizer_path, cache_dir, 1, 2)
    for i in range(3):
        assert _same(first.next_batch(), expected[i])
    saved = json.loads(json.dumps(first.state_dict()))
    assert saved["steps"] == 3 and saved["rows_consumed"] == 3 * GLOBAL_BATCH // 2
    other = json.loads(json.dumps(_loader(recipe, tokenizer_path, cache_dir, 0, 2).state_dict()))
    # rank 0 never stepped in this simulation; pretend it did for the checkpoint
    other["steps"], other["rows_consumed"] = 3, saved["rows_consumed"]

    resumed = _loader(recipe, tokenizer_path, cache_dir, 1, 2)
    resumed.load_state_dict([other, saved])
    # state right after a load (before any batch) equals what was loaded
    assert resumed.state_dict()["dataloader"] == saved["dataloader"]
    for i in range(3, 8):
        assert _same(resumed.next_batch(), expected[i])
    assert resumed.state_dict()["steps"] == 8


def test_resume_other_dp_size_is_refused(recipe, tokenizer_path, cache_dir):
    ranks = [_loader(recipe, tokenizer_path, cache_dir, r, 2) for r in range(2)]
    _run(ranks, 2)
    states = [json.loads(json.dumps(ld.state_dict())) for ld in ranks]
    new = _loader(recipe, tokenizer_path, cache_dir, 0, 4)
    with pytest.raises(StateError, match=r"written with 2 data-parallel ranks, this run has 4"):
        new.load_state_dict(states)
    with pytest.raises(ValueError, match="refuse, skip"):
        new.load_state_dict(states, mode="bogus")


def test_skip_mode_changes_the_global_batches(recipe, tokenizer_path, cache_dir):
    k, more = 3, 4
    ref = [_loader(recipe, tokenizer_path, cache_dir, r, 2) for r in range(2)]
    before = _run(ref, k)
    states = [json.loads(json.dumps(ld.state_dict())) for ld in ref]
    after = _run(ref, more)  # the uninterrupted run, steps k .. k+more-1

    for new_size in (1, 4):
        resumed = [_loader(recipe, tokenizer_path, cache_dir, r, new_size) for r in range(new_size)]
        for ld in resumed:
            ld.load_state_dict(states, mode="skip")
            st = ld.state_dict()
            assert st["steps"] == k
            assert st["rows_consumed"] == k * GLOBAL_BATCH // new_size
        got = _run(resumed, more)
        for i in range(more):
            assert all(b.step == k + i for b in got[i])
            rows_new, digest_new = _global(got[i])
            rows_old, digest_old = _global(after[i])
            assert rows_new.shape == rows_old.shape == (GLOBAL_BATCH, SEQ_LEN)
            assert digest_new != digest_old
            assert not np.array_equal(rows_new, rows_old)
    # At the same size, skipping the consumed batches continues exactly: the
    # differences above come from the new size, not from a wrong skip.
    same = [_loader(recipe, tokenizer_path, cache_dir, r, 2) for r in range(2)]
    for ld in same:
        ld.load_state_dict(states, mode="skip")
    got = _run(same, more)
    assert [_global(s)[1] for s in got] == [_global(s)[1] for s in after]
    # and none of the batches trained before the checkpoint comes back.
    assert not {_global(s)[1] for s in before} & {_global(s)[1] for s in got}


def test_workers_and_stop_at_end(tmp_path, tokenizer_path, cache_dir):
    recipe = _write_recipe(tmp_path, [("books", 40, 2.0, "stop"), ("news", 30, 1.0, "stop")])
    # num_workers=0: a finite corpus ends with StopIteration, and again afterwards
    ld = _loader(recipe, tokenizer_path, cache_dir, 0, 2)
    batches = []
    with pytest.raises(StopIteration):
        while True:
            batches.append(ld.next_batch())
    assert len(batches) > 3
    with pytest.raises(StopIteration):
        ld.next_batch()
    # The state at the end counts what was consumed, and a loader restored from
    # it (through JSON) ends at once instead of starting over.
    end = json.loads(json.dumps(ld.state_dict()))
    assert end["steps"] == len(batches) and end["rows_consumed"] == 2 * len(batches)
    restored = _loader(recipe, tokenizer_path, cache_dir, 0, 2)
    restored.load_state_dict([end, dict(end, dp_rank=1)])
    with pytest.raises(StopIteration):
        restored.next_batch()

    # num_workers=2: checkpoint after consumed batches, resume continues identically
    ref = _loader(recipe, tokenizer_path, cache_dir, 0, 2, num_workers=2)
    expected = [ref.next_batch() for _ in range(5)]
    ref.close()
    first = _loader(recipe, tokenizer_path, cache_dir, 0, 2, num_workers=2)
    for i in range(2):
        assert _same(first.next_batch(), expected[i])
    saved = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = _loader(recipe, tokenizer_path, cache_dir, 0, 2, num_workers=2)
    other = dict(saved, dp_rank=1)
    resumed.load_state_dict([saved, other])
    for i in range(2, 5):
        assert _same(resumed.next_batch(), expected[i])
    resumed.close()


def test_repeat_sources_loop_and_stop_sources_do_not(tmp_path, tokenizer_path, cache_dir):
    recipe = _write_recipe(tmp_path, [("loop", 12, 1.0, "repeat"), ("once", 12, 1.0, "stop")])
    ld = _loader(recipe, tokenizer_path, cache_dir, 1, 2)
    epoch_rows: dict[int, int] = {}
    for _ in range(40):
        ld.next_batch()
        epoch_rows[ld._dataset.epoch] = epoch_rows.get(ld._dataset.epoch, 0) + 1
    assert len(epoch_rows) >= 3  # the shard was read several times
    # after the first pass only the "repeat" source is read, so epochs are shorter
    assert epoch_rows[0] > epoch_rows[1]


def test_a_recipe_with_phases_is_refused(recipe, tokenizer_path, cache_dir):
    """The baseline reads one fixed mixture: a data schedule is Zephon's."""
    from dataclasses import replace

    from zephon.schema.recipe import PhaseSpec

    phased = replace(recipe, phases=(PhaseSpec("base", 0), PhaseSpec("anneal", 5)))
    with pytest.raises(ZephonError, match="this recipe has 2 phases \\(base, anneal\\)"):
        _loader(phased, tokenizer_path, cache_dir, 0, 1)
    one = replace(recipe, phases=(PhaseSpec("base", 0),))
    assert _loader(one, tokenizer_path, cache_dir, 0, 1).next_batch().num_rows == GLOBAL_BATCH
