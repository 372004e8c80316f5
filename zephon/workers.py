"""The worker side: where blocks are read and tokenized.

With no workers a block is read and tokenized inline when a lane first needs
it. With workers, a thread pool reads and decodes blocks ahead of the lanes and
hands the texts to one encoder thread that tokenizes everything queued in few,
large `encode_batch` calls (small calls are slow: each wakes the tokenizer's
own thread pool for a handful of documents). Either way a lane gets a handle
whose `.result()` is the block's tokens, and waits on handles in the order it
submitted them, so none of this changes the output.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from zephon.shuffle import SourcePlan
from zephon.sources import SourceReader
from zephon.tokenize import (
    RawBlock,
    TokenizedBlock,
    TokenizerInfo,
    check_token_ids,
    encode_texts,
    read_block,
    tokenize_block,
)


class Deferred:
    """A handle that runs its work on first `.result()`: the no-worker mode."""

    def __init__(self, fn: Callable[..., Any], *args: Any):
        self._fn, self._args, self._done, self._value = fn, args, False, None

    def result(self) -> Any:
        if not self._done:
            self._value, self._done = self._fn(*self._args), True
        return self._value

    def cancel(self) -> bool:
        self._done, self._value = True, None
        return True


class _TwoStage:
    """Handle for a block being read on the pool and then encoded."""

    def __init__(self, read: Future):
        self._read = read

    def result(self) -> TokenizedBlock:
        return self._read.result().result()

    def cancel(self) -> bool:
        return self._read.cancel()  # once read, its encoding is simply dropped


class _Request:
    __slots__ = ("raw", "future")

    def __init__(self, raw: RawBlock):
        self.raw, self.future = raw, Future()


class EncodeBatcher:
    """Tokenizes the blocks that workers have read in few, large `encode_batch` calls.

    Small calls are slow: each one wakes the tokenizer's thread pool for a few
    documents. Workers hand read blocks to one thread that takes everything
    queued (up to `max_docs` documents) per call. Tokenization is per
    document, so grouping never changes the ids.
    """

    def __init__(self, tok: TokenizerInfo, max_docs: int = 1024, threads: int = 2):
        self.tok, self.max_docs = tok, max_docs
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        # Two callers overlap: one call's tail (a few long documents on a few
        # cores) runs while the next call already keeps the other cores busy.
        self._threads = [
            threading.Thread(target=self._run, name=f"zephon-encode-{i}", daemon=True)
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    def submit(self, raw: RawBlock) -> Future:
        req = _Request(raw)
        self._queue.put(req)
        return req.future

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            reqs, n, stop = [first], len(first.raw.values), False
            while n < self.max_docs:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                reqs.append(nxt)
                n += len(nxt.raw.values)
            reqs = [r for r in reqs if r.future.set_running_or_notify_cancel()]
            try:
                docs = encode_texts([v for r in reqs for v in r.raw.values], self.tok)
            except BaseException as exc:  # handed to whoever waits on these blocks
                for r in reqs:
                    r.future.set_exception(exc)
            else:
                at = 0
                for r in reqs:
                    k = len(r.raw.values)
                    r.future.set_result(TokenizedBlock(docs[at : at + k], r.raw.doc_ids))
                    at += k
            if stop:
                return

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()


class BlockWork:
    """Schedules block reads and tokenization for all lanes of one loader."""

    def __init__(self, tok: TokenizerInfo, workers: int, max_docs: int = 1024):
        self.tok = tok
        self._pool = ThreadPoolExecutor(workers, "zephon-worker") if workers > 0 else None
        self._batcher = EncodeBatcher(tok, max_docs) if workers > 0 else None

    def submit(
        self, reader: SourceReader, plan: SourcePlan, epoch: int, block: int, skip: int
    ) -> Any:
        """A handle whose `.result()` is the TokenizedBlock."""
        if self._pool is None:
            return Deferred(tokenize_block, reader, plan, self.tok, epoch, block, skip)
        return _TwoStage(self._pool.submit(self._read, reader, plan, epoch, block, skip))

    def _read(
        self, reader: SourceReader, plan: SourcePlan, epoch: int, block: int, skip: int
    ) -> Future:
        raw = read_block(reader, plan, epoch, block, skip)
        if reader.spec.pretokenized:
            done: Future = Future()
            done.set_result(check_token_ids(raw, reader, self.tok))
            return done
        assert self._batcher is not None
        return self._batcher.submit(raw)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._batcher is not None:
            self._batcher.close()
            self._batcher = None
