from typing import NamedTuple

import pytest
import torch

from torchtitan.components.lr_scheduler import build_lr_scheduler, lr_of_step
from torchtitan.components.optimizer import build_optimizer
from torchtitan.config.job_config import ConfigError, LRSchedulerConfig, OptimizerConfig

LR = 1e-3


class Phase(NamedTuple):
    name: str | None
    start_step: int
    end_step: int | None


# A recipe's data phases: the anneal is steps 71..90 of 100.
PHASES = (Phase("warmup", 0, 10), Phase("main", 10, 70), Phase("anneal", 70, 90),
          Phase("cooldown", 90, None))  # fmt: skip


def make(total: int = 100, phases=(), **kw: object) -> tuple[torch.optim.Optimizer, object]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = build_optimizer(model, OptimizerConfig(lr=LR))
    cfg = LRSchedulerConfig(warmup_steps=5, decay_ratio=0.2, min_lr_factor=0.1)
    for k, v in kw.items():
        setattr(cfg, k, v)
    return opt, build_lr_scheduler(opt, cfg, total, phases)


def lrs(total: int = 100, phases=(), **kw: object) -> list[float]:
    opt, sched = make(total, phases, **kw)
    out = []
    for step in range(1, total + 1):
        out.append(opt.param_groups[0]["lr"])  # lr used by this training step
        opt.step()
        sched.step()
        assert lr_of_step(sched, step) == pytest.approx(out[-1])  # what the trainer logs
    return out


def test_warmup_starts_near_zero_and_rises() -> None:
    seq = lrs()
    assert 0 < seq[0] <= LR / 5
    assert all(a < b for a, b in zip(seq[:6], seq[1:6], strict=False))
    assert seq[5] == pytest.approx(LR)


def test_stable_then_linear_decay_to_min() -> None:
    seq = lrs()
    assert all(x == pytest.approx(LR) for x in seq[5:80])
    assert all(a > b for a, b in zip(seq[80:], seq[81:], strict=False))
    assert seq[-1] == pytest.approx(0.1 * LR)
    assert seq[90] == pytest.approx(LR * (1 - 0.9 * 11 / 20))


def test_cosine_decay_end_value() -> None:
    seq = lrs(decay_type="cosine")
    assert seq[79] == pytest.approx(LR)
    assert seq[-1] == pytest.approx(0.1 * LR)
    assert seq[89] == pytest.approx(LR * (0.1 + 0.9 * 0.5))  # halfway through decay


def test_decay_never_overlaps_warmup() -> None:
    seq = lrs(total=6, decay_ratio=1.0)
    assert seq[4] == pytest.approx(5 / 6 * LR)  # last warmup step
    assert seq[5] == pytest.approx(0.1 * LR)  # the single decay step ends at the floor


def test_state_dict_round_trip() -> None:
    opt, sched = make()
    for _ in range(37):
        opt.step()
        sched.step()
    state = sched.state_dict()
    opt2, sched2 = make()
    sched2.load_state_dict(state)
    assert sched2.last_epoch == 37
    for _ in range(50):
        opt.step()
        sched.step()
        opt2.step()
        sched2.step()
        assert sched2.get_last_lr() == pytest.approx(sched.get_last_lr())


def test_optimizer_groups() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = build_optimizer(model, OptimizerConfig(weight_decay=0.1))
    assert isinstance(opt, torch.optim.AdamW)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and [p.ndim for p in decay["params"]] == [2]
    assert no_decay["weight_decay"] == 0.0 and len(no_decay["params"]) == 3
    assert decay["betas"] == (0.9, 0.95)


def test_decay_spans_the_named_phase() -> None:
    """decay_phase = "anneal": stable until the anneal's first step (71), decaying over
    exactly its 20 steps to the floor at its last (90), held after it."""
    seq = lrs(phases=PHASES, decay_phase="anneal")
    assert all(x == pytest.approx(LR) for x in seq[5:70])
    assert seq[70] == pytest.approx(LR * (1 - 0.9 / 20))  # step 71 decays already
    assert all(a > b for a, b in zip(seq[70:90], seq[71:90], strict=False))
    assert seq[89] == pytest.approx(0.1 * LR)
    assert all(x == pytest.approx(0.1 * LR) for x in seq[89:])
    # The last phase decays until training.steps.
    seq = lrs(phases=PHASES, decay_phase="cooldown", decay_type="cosine")
    assert seq[89] == pytest.approx(LR) and seq[99] == pytest.approx(0.1 * LR)
    assert seq[94] == pytest.approx(LR * (0.1 + 0.9 * 0.5))


@pytest.mark.parametrize(
    ("phases", "total", "name", "expected"),
    [
        (PHASES, 100, "anneel", "names no phase of the data recipe (its phases: 'warmup', 'main'"),
        ((Phase(None, 0, None),), 100, "anneal", "it has no [[phase]] tables"),
        (PHASES, 100, "warmup", "inside the warmup (lr_scheduler.warmup_steps = 5)"),
        (PHASES, 60, "anneal", "starts after step 70, but training.steps is 60"),
    ],
)
def test_decay_phase_errors_name_the_phase(phases, total, name, expected) -> None:
    with pytest.raises(ConfigError) as exc:
        make(total, phases, decay_phase=name)
    assert f"lr_scheduler.decay_phase = {name!r}" in str(exc.value)
    assert expected in str(exc.value)
