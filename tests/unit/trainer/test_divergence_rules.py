"""The divergence guard's bookkeeping and words, exactly (torchtitan/components/divergence.py)."""

from __future__ import annotations

import logging

import torch

from torchtitan.components import divergence
from torchtitan.components.divergence import DivergenceGuard


def test_a_new_guard_has_seen_nothing():
    guard = DivergenceGuard(2)
    assert (guard.in_a_row, guard.skipped, guard.first_bad) == (0, 0, 0)
    assert guard.last_finite and not guard.should_stop()


def test_counts_in_a_row_and_in_the_run_and_the_first_bad_step():
    guard = DivergenceGuard(2, log=False)
    assert [guard.update_ok(s, n) for s, n in ((5, float("nan")), (6, 1.0), (7, float("inf")))] == [
        False,
        True,
        False,
    ]
    assert (guard.in_a_row, guard.skipped, guard.first_bad) == (1, 2, 7)
    assert not guard.should_stop()
    assert not guard.update_ok(8, float("-inf"))
    assert (guard.in_a_row, guard.skipped, guard.first_bad) == (2, 3, 7)
    assert guard.should_stop()


def test_each_skipped_step_is_logged_by_default_with_its_counts(caplog):
    guard = DivergenceGuard(3)
    with caplog.at_level(logging.WARNING, logger="torchtitan"):
        guard.update_ok(4, 2.0)
        guard.update_ok(5, float("nan"))
        guard.update_ok(6, float("inf"))
    assert [r.getMessage() for r in caplog.records] == [
        "step 5: loss or gradient norm not finite (norm nan, loss None): update skipped (1 in "
        "a row, training.max_nonfinite_steps = 3; 1 skipped in this run)",
        "step 6: loss or gradient norm not finite (norm inf, loss None): update skipped (2 in "
        "a row, training.max_nonfinite_steps = 3; 2 skipped in this run)",
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="torchtitan"):
        DivergenceGuard(3, log=False).update_ok(1, float("nan"))  # ranks other than 0
    assert not caplog.records


def test_the_stop_message_names_the_steps_and_the_way_back():
    guard = DivergenceGuard(2, log=False)
    guard.update_ok(9, float("nan"))
    guard.update_ok(10, float("nan"))
    assert guard.safe_below == 8
    assert str(guard.stop_error(10, (7, "/ck/step-7", 2.5))) == (
        "training diverged: trouble began at step 9 (loss or gradient norm not finite (norm "
        "nan, loss None)); steps 9..10 were bad (2 in a row, training.max_nonfinite_steps = 2), "
        "their updates were skipped and the job stops. The checkpoint of step 8, if any, holds "
        "the update that led to it. The newest checkpoint from before the trouble began is "
        "step 7 (/ck/step-7, loss 2.5): resume from it with --checkpoint.load_step 7 and a "
        "smaller --optimizer.lr"
    )
    assert str(guard.stop_error(10, None)).endswith(
        "No checkpoint from before step 8 was kept: start again (another --job.dump_folder) "
        "with a smaller --optimizer.lr"
    )


def test_a_distributed_tensor_is_checked_on_its_local_shard(monkeypatch):
    class Sharded:  # stands for a DTensor: what `_local` needs of one
        def to_local(self) -> torch.Tensor:
            return torch.tensor([1.0, 2.0])

    monkeypatch.setattr(divergence, "DTensor", Sharded)
    assert torch.equal(divergence._local(Sharded()), torch.tensor([1.0, 2.0]))
    plain = torch.tensor([3.0])
    assert divergence._local(plain) is plain
