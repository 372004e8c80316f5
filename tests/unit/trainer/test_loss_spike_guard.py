"""The divergence guard's loss rules, exactly (torchtitan/components/divergence.py): a
non-finite loss is trouble, a finite one above `spike_factor` times the running median
of the last applied steps' losses is a spike, and the stop message names the
checkpoint to go back to with its step and loss."""

from __future__ import annotations

import logging

from torchtitan.components.divergence import SPIKE_WARMUP, SPIKE_WINDOW, DivergenceGuard


def warmed(guard: DivergenceGuard, losses: list[float], first_step: int = 1) -> int:
    """Feed applied steps with these losses (finite gradient norms); the next step."""
    for i, loss in enumerate(losses):
        assert guard.update_ok(first_step + i, 1.0, loss), (first_step + i, loss)
    return first_step + len(losses)


def test_a_new_guard_tracks_no_loss_and_has_no_reason_yet():
    guard = DivergenceGuard(3)
    assert (guard.spike_factor, guard.tracks_loss, guard.first_reason) == (0.0, False, "")
    assert DivergenceGuard(3, spike_factor=2.0).tracks_loss


def test_without_a_spike_factor_any_finite_loss_is_applied():
    guard = DivergenceGuard(3, log=False)
    step = warmed(guard, [1.0] * (SPIKE_WARMUP + 2))
    assert guard.update_ok(step, 1.0, 1e6)
    assert (guard.in_a_row, guard.skipped) == (0, 0)


def test_a_finite_loss_under_the_factor_is_applied_and_a_nonfinite_one_is_not():
    guard = DivergenceGuard(3, spike_factor=2.0, log=False)
    assert guard.update_ok(1, 1.0, 2.5)  # the very first loss: nothing to compare with
    assert not guard.update_ok(2, 1.0, float("nan"))  # a finite norm does not save it
    assert guard.first_reason == "loss or gradient norm not finite (norm 1.0, loss nan)"
    assert not guard.update_ok(3, 1.0, float("inf"))
    assert (guard.in_a_row, guard.skipped, guard.first_bad) == (2, 2, 2)


def test_no_spike_is_called_before_the_warmup_losses():
    guard = DivergenceGuard(3, spike_factor=2.0, log=False)
    # A hundredfold loss on each of the first SPIKE_WARMUP steps: too few losses yet.
    step = warmed(guard, [1.0] + [100.0 * (i + 1) for i in range(SPIKE_WARMUP - 1)])
    assert guard.update_ok(step, 1.0, 1e9) is False  # now SPIKE_WARMUP losses were seen


def test_a_spike_is_called_from_exactly_the_warmup_count_on(caplog):
    guard = DivergenceGuard(3, spike_factor=2.0)
    step = warmed(guard, [1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0])  # median 1.5
    assert step == SPIKE_WARMUP + 1
    with caplog.at_level(logging.WARNING, logger="torchtitan"):
        assert guard.update_ok(step, 1.0, 3.5) is False
    reason = (
        "loss spike: 3.5 > 2 x 1.5, the median of the last 8 applied steps "
        "(training.loss_spike_factor)"
    )
    assert guard.first_reason == reason
    assert [r.getMessage() for r in caplog.records] == [
        f"step 9: {reason}: update skipped (1 in a row, training.max_nonfinite_steps = 3; "
        "1 skipped in this run)"
    ]


def test_a_loss_of_exactly_the_factor_times_the_median_is_applied():
    guard = DivergenceGuard(3, spike_factor=2.0, log=False)
    step = warmed(guard, [2.0] * SPIKE_WARMUP)
    assert guard.update_ok(step, 1.0, 4.0)  # 4 = 2 x 2: not above
    assert not guard.update_ok(step + 1, 1.0, 4.001)


def test_the_factor_multiplies_the_median():
    guard = DivergenceGuard(3, spike_factor=3.0, log=False)
    step = warmed(guard, [2.0] * SPIKE_WARMUP)
    assert guard.update_ok(step, 1.0, 5.9)  # under 3 x 2 = 6 (3 / 2 would call it a spike)
    assert not guard.update_ok(step + 1, 1.0, 6.1)


def test_the_median_is_of_the_last_window_of_applied_losses():
    guard = DivergenceGuard(3, spike_factor=2.0, log=False)
    step = warmed(guard, [10.0] * SPIKE_WINDOW + [1.0] * SPIKE_WINDOW)
    # The window holds only the last SPIKE_WINDOW losses, all 1.0: 3 is a spike
    # (over every loss seen the median would be 5.5).
    assert not guard.update_ok(step, 1.0, 3.0)
    assert guard.first_reason == (
        f"loss spike: 3 > 2 x 1, the median of the last {SPIKE_WINDOW} applied steps "
        "(training.loss_spike_factor)"
    )


def test_skipped_steps_do_not_enter_the_median():
    guard = DivergenceGuard(5, spike_factor=2.0, log=False)
    step = warmed(guard, [1.0] * SPIKE_WARMUP)
    assert not guard.update_ok(step, 1.0, 50.0)
    assert not guard.update_ok(step + 1, 1.0, 50.0)  # the median is still 1, not raised
    assert guard.update_ok(step + 2, 1.0, 1.5)
    assert guard.in_a_row == 0 and guard.skipped == 2


def test_a_step_without_a_loss_is_judged_by_its_norm_alone_even_when_spikes_are_tracked():
    guard = DivergenceGuard(3, spike_factor=2.0, log=False)
    step = warmed(guard, [1.0] * SPIKE_WARMUP)
    assert guard.update_ok(step, 1.0)  # no loss given: no spike to call
    assert not guard.update_ok(step + 1, float("nan"))
    assert guard.first_reason == "loss or gradient norm not finite (norm nan, loss None)"


def test_the_stop_message_without_the_loss_of_the_checkpoint_to_go_back_to():
    guard = DivergenceGuard(1, log=False)
    guard.update_ok(6, float("inf"))
    assert str(guard.stop_error(6, (4, "/ck/step-4", None))) == (
        "training diverged: trouble began at step 6 (loss or gradient norm not finite (norm "
        "inf, loss None)); steps 6..6 were bad (1 in a row, training.max_nonfinite_steps = 1), "
        "their updates were skipped and the job stops. The checkpoint of step 5, if any, holds "
        "the update that led to it. The newest checkpoint from before the trouble began is "
        "step 4 (/ck/step-4): resume from it with --checkpoint.load_step 4 and a smaller "
        "--optimizer.lr"
    )


def test_the_stop_message_names_the_leading_checkpoint_only_from_step_1_on():
    at_2 = DivergenceGuard(1, log=False)
    at_2.update_ok(2, float("nan"))  # safe_below 1: a checkpoint of step 1 can exist
    assert " The checkpoint of step 1, if any, holds the update that led to it. " in str(
        at_2.stop_error(2, None)
    )
    at_1 = DivergenceGuard(1, log=False)
    at_1.update_ok(1, float("nan"))  # safe_below 0: no step before it to name
    assert str(at_1.stop_error(1, None)) == (
        "training diverged: trouble began at step 1 (loss or gradient norm not finite (norm "
        "nan, loss None)); steps 1..1 were bad (1 in a row, training.max_nonfinite_steps = 1), "
        "their updates were skipped and the job stops. No checkpoint from before step 0 was "
        "kept: start again (another --job.dump_folder) with a smaller --optimizer.lr"
    )


def test_the_stop_message_of_a_spike_gives_the_checkpoints_loss():
    guard = DivergenceGuard(2, spike_factor=4.0, log=False)
    step = warmed(guard, [2.0] * SPIKE_WARMUP, first_step=11)
    assert not guard.update_ok(step, 1.0, 12.0)
    assert not guard.update_ok(step + 1, 1.0, 30.0)
    assert guard.should_stop() and guard.safe_below == 18
    assert str(guard.stop_error(step + 1, (17, "/ck/step-17", 2.012345))) == (
        "training diverged: trouble began at step 19 (loss spike: 12 > 4 x 2, the median of "
        "the last 8 applied steps (training.loss_spike_factor)); steps 19..20 were bad (2 in a "
        "row, training.max_nonfinite_steps = 2), their updates were skipped and the job stops. "
        "The checkpoint of step 18, if any, holds the update that led to it. The newest "
        "checkpoint from before the trouble began is step 17 (/ck/step-17, loss 2.012): resume "
        "from it with --checkpoint.load_step 17 and a smaller --optimizer.lr"
    )
