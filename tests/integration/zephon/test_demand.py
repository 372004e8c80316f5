"""Work in proportion to what is consumed: counted start-up and restore work,
one lookahead budget, and per-source counts that do not depend on the rank count."""

from __future__ import annotations

import itertools
import threading
import warnings

import numpy as np
import pytest
from helpers.corpus import WORDS, write_jsonl
from helpers.loader import GLOBAL_BATCH, SEQ_LEN, close, make_ranks, save, step_digests

from zephon import ZephonLoader, load_recipe
from zephon.sources import SourceReader
from zephon.tokenize.tokenizer import encode_texts, load_tokenizer

ROW = SEQ_LEN + 1


def _max_doc_tokens(recipe_path, tokenizer_path) -> int:
    recipe = load_recipe(recipe_path)
    tok = load_tokenizer(tokenizer_path)
    longest = 0
    for spec in recipe.sources:
        reader = SourceReader(spec, recipe.execution.cache_dir)
        docs = encode_texts(reader.read_range(0, reader.num_docs), tok)
        longest = max(longest, max(len(d) for d in docs))
    return longest


def test_work_before_the_first_batch_is_what_it_needs(make_recipe, tokenizer_path):
    """Before the first batch is assembled only documents the rows need are
    tokenized (lookahead starts after it). So, for `concat`:

        tokens tokenized <= tokens of the rows delivered
                            + tokens of the rows replayed (< flush_interval per lane)
                            + per lane, the tokens of its resumed document that precede
                              its flush point (skip_tokens)
                            + per lane, the rest of the one document that straddles the
                              end of its last row (at most one document)

    and the documents tokenized are exactly the documents the lanes picked."""
    lanes, flush = 16, 8
    recipe = make_recipe(lanes=lanes, flush_interval=flush, block_size=16)
    longest = _max_doc_tokens(recipe, tokenizer_path)
    global_batch = 2 * lanes  # 2 rows per lane per step: flush points every 4 steps
    kw = {"global_batch_size": global_batch, "prefetch": 0}
    states = {0: None}
    source = make_ranks(recipe, tokenizer_path, 1, num_workers=0, **kw)[0]
    for step in (10, 1002):  # both 2 steps past a flush point: 4 rows to replay per lane
        while source.step < step:
            source.next_batch()
        states[step] = save([source])
    source.close()
    for (step, state), workers in itertools.product(states.items(), (0, 2)):
        loader = make_ranks(recipe, tokenizer_path, 1, num_workers=workers, **kw)[0]
        if state is not None:
            loader.load_state_dict(state)
        batch = loader.next_batch()
        stats = loader.stats()
        first = stats["first_batch"]
        replay_rows = stats["replay"]["rows"]
        skip = 0
        if state is not None:
            skip = sum(e["flush"]["skip_tokens"] for e in state["lanes"].values())
            assert replay_rows == lanes * 4
        assert first["row_tokens"] == batch.num_rows + batch.num_valid_tokens()
        bound = first["row_tokens"] + replay_rows * ROW + skip + lanes * longest
        assert first["tokens_tokenized"] <= bound, (step, first, bound)
        # Not a loose bound: at least the rows themselves were tokenized.
        assert first["tokens_tokenized"] >= first["row_tokens"] + replay_rows * ROW
        assert first["docs_tokenized"] == stats["docs_packed"], (step, first, stats)
        loader.close()


def test_lookahead_stays_within_its_budget(make_recipe, tokenizer_path):
    """Tokens tokenized and not yet taken stay within the budget, plus what the
    step being produced needs: its rows and one document per lane straddling
    their end (the budget never holds that step back).

    Documents of nearly equal, short length keep that allowance tight (about
    800 tokens here), so the bound can fail: with the budget check removed a
    budget of 1 token peaks at about 1,230 tokens (a whole step ahead), while a
    large budget that is honoured is used up to its size."""
    recipe = make_recipe(lanes=8)
    root = recipe.parent
    for k, name in enumerate(("prose", "code")):  # 16 words each: 17 to 33 tokens
        docs = [
            " ".join(WORDS[(7 * i + j + k) % len(WORDS)] for j in range(16)) for i in range(300)
        ]
        write_jsonl(root / f"{name}.jsonl", docs)
    longest = _max_doc_tokens(recipe, tokenizer_path)
    assert longest <= 40
    allowance = GLOBAL_BATCH * ROW + 8 * longest

    for budget in (1, 400, 4000):
        loader = ZephonLoader(
            recipe, tokenizer_path, SEQ_LEN, GLOBAL_BATCH, num_workers=2, prefetch=2,
            lookahead_tokens=budget,
        )  # fmt: skip
        for _ in range(30):
            loader.next_batch()
        work = loader.stats()["work"]
        loader.close()
        assert work["lookahead_budget"] == budget
        assert work["lookahead_peak_tokens"] <= budget + allowance, (budget, work)
    # The budget is what governs lookahead (not a fixed or default one): a large
    # one is used.
    assert work["lookahead_peak_tokens"] >= budget // 2, work


def test_block_prefetch_is_deprecated_not_rejected(make_recipe, tokenizer_path):
    path = make_recipe(extra="")
    text = path.read_text().replace("[execution]\n", "[execution]\nblock_prefetch = 4\n")
    path.write_text(text)
    with pytest.warns(DeprecationWarning, match="block_prefetch"):
        recipe = load_recipe(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        plain = make_recipe()
    assert recipe.digest() == load_recipe(plain).digest()  # not part of the recipe identity


@pytest.mark.parametrize("algorithm", ["concat", "best_fit"])
def test_source_counts_do_not_depend_on_ranks(make_recipe, tokenizer_path, algorithm):
    recipe = make_recipe(algorithm=algorithm, sources=[("a", 200, 0.5), ("b", 150, 0.3)])
    per_dp = {}
    for dp in (1, 2, 4):
        loaders = make_ranks(recipe, tokenizer_path, dp)
        steps = []
        for _ in range(6):
            batches = [ld.next_batch() for ld in loaders]
            for b in batches:
                assert b.source_names == ("a", "b")
                assert b.source_tokens.dtype == np.int64 and b.source_docs.dtype == np.int64
                # every non-padding token of the rows (seq_len + 1 each) has a source
                assert int(b.source_tokens.sum()) == b.num_rows + b.num_valid_tokens()
            steps.append(
                (
                    sum(b.source_tokens for b in batches).tolist(),
                    sum(b.source_docs for b in batches).tolist(),
                )
            )
        per_dp[dp] = steps
        close(loaders)
    assert per_dp[1] == per_dp[2] == per_dp[4]
    assert all(min(tokens) > 0 and min(docs) > 0 for tokens, docs in per_dp[1])


def test_source_docs_count_documents_starting_in_the_rows(make_recipe, tokenizer_path):
    """Drained to the end (stop), every picked document starts in exactly one row."""
    recipe = make_recipe(sources=[("a", 120, 0.6), ("b", 90, 0.4)], on_exhausted="stop")
    loader = ZephonLoader(recipe, tokenizer_path, SEQ_LEN, GLOBAL_BATCH, trace=True, prefetch=0)
    loader.start()
    docs = np.zeros(2, dtype=np.int64)
    tokens = np.zeros(2, dtype=np.int64)
    real = 0
    for lane in loader.lanes:
        while (row := lane.next_row()) is not None:
            tokens += lane.last_sources[0]
            docs += lane.last_sources[1]
            real += int((row[1] >= 0).sum())
    assert docs.tolist() == [120, 90]  # one epoch, every document once
    assert int(tokens.sum()) == real
    loader.close()


def test_restored_source_counts_match(make_recipe, tokenizer_path):
    recipe = make_recipe(flush_interval=8)
    loaders = make_ranks(recipe, tokenizer_path, 2)
    step_digests(loaders, 5)
    state = save(loaders)
    expected = [[b.source_tokens.tolist() for b in (ld.next_batch() for ld in loaders)]]
    close(loaders)
    resumed = make_ranks(recipe, tokenizer_path, 2)
    for ld in resumed:
        ld.load_state_dict(state)
    got = [[b.source_tokens.tolist() for b in (ld.next_batch() for ld in resumed)]]
    close(resumed)
    assert got == expected


def test_long_documents_drawn_again_give_the_same_batches(tmp_path, tokenizer_path):
    """Long documents (encoded in pieces, their ids cached) under a tiny lookahead
    budget, drawn again in later epochs: the same batches as the inline default."""
    from helpers.corpus import synthetic_docs, write_jsonl

    long_docs = [" ".join(synthetic_docs(700, seed=40 + k)) for k in range(16)]
    assert min(len(d) for d in long_docs) > 70_000
    write_jsonl(tmp_path / "long.jsonl", long_docs)
    write_jsonl(tmp_path / "short.jsonl", synthetic_docs(200, seed=9))
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(
        '[recipe]\nname = "long"\nlanes = 8\n[shuffle]\nblock_size = 2\n'
        f'[execution]\ncache_dir = "{tmp_path / "cache"}"\n'
        '[[source]]\nname = "long"\npath = "long.jsonl"\n'
        '[[source]]\nname = "short"\npath = "short.jsonl"\n'
    )
    kw = {"seq_len": 1024, "global_batch_size": 64}
    ref = make_ranks(recipe, tokenizer_path, 1, num_workers=0, prefetch=0, **kw)
    expected = step_digests(ref, 30)
    close(ref)
    for budget in (300, None):
        loaders = make_ranks(recipe, tokenizer_path, 2, lookahead_tokens=budget, **kw)
        assert step_digests(loaders, 30) == expected, budget
        assert sum(ld.stats()["work"]["docs_from_cache"] for ld in loaders) > 0
        close(loaders)


class _FailingTokenizer:
    """A tokenizer that fails on its `fail_at`-th batch call (counted from 1)."""

    def __init__(self, inner, fail_at: int):
        self.inner, self.fail_at, self.calls = inner, fail_at, 0

    def encode_batch_fast(self, texts, add_special_tokens=False):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("tokenizer broke on purpose")
        return self.inner.encode_batch_fast(texts, add_special_tokens=add_special_tokens)

    def encode(self, text, add_special_tokens=False):
        return self.inner.encode(text, add_special_tokens=add_special_tokens)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fail_at", [1, 5])
def test_a_tokenizer_error_reaches_the_trainer(make_recipe, tokenizer_path, workers, fail_at):
    """A call that fails hands its error to the lanes waiting on its documents:
    next_batch raises it (before or after the first batch), and close() returns."""
    import dataclasses

    tok = load_tokenizer(tokenizer_path)
    broken = dataclasses.replace(tok, tokenizer=_FailingTokenizer(tok.tokenizer, fail_at))
    loader = ZephonLoader(
        make_recipe(lanes=4), broken, SEQ_LEN, GLOBAL_BATCH, num_workers=workers, prefetch=2
    )
    raised: list[BaseException] = []

    def consume() -> None:
        try:
            for _ in range(50):
                loader.next_batch()
        except BaseException as exc:
            raised.append(exc)

    # On a thread with a deadline: a lost error would leave next_batch waiting
    # forever, and the test must fail then, not hang.
    t = threading.Thread(target=consume, daemon=True)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "next_batch still waits: the tokenizer's error was lost"
    assert len(raised) == 1 and isinstance(raised[0], RuntimeError), raised
    assert "broke on purpose" in str(raised[0])
    loader.close()
