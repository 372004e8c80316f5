import pytest
import torch

from torchtitan.components.lr_scheduler import build_lr_scheduler
from torchtitan.components.optimizer import build_optimizer
from torchtitan.config.job_config import LRSchedulerConfig, OptimizerConfig

LR = 1e-3


def make(total: int = 100, **kw: object) -> tuple[torch.optim.Optimizer, object]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = build_optimizer(model, OptimizerConfig(lr=LR))
    cfg = LRSchedulerConfig(warmup_steps=5, decay_ratio=0.2, min_lr_factor=0.1)
    for k, v in kw.items():
        setattr(cfg, k, v)
    return opt, build_lr_scheduler(opt, cfg, total)


def lrs(total: int = 100, **kw: object) -> list[float]:
    opt, sched = make(total, **kw)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])  # lr used by this training step
        opt.step()
        sched.step()
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
