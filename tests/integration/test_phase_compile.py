"""A compiled model recompiles at most once per data phase.

Within a phase every micro-batch the trainer runs has one shape: the phase's
micro-batch rows (here `training.local_batch_tokens` / seq_len, so every
micro-batch holds the same tokens) by its seq_len, on every rank, padded ranks
included. So `training.compile` (blocks compiled in place) compiles on the
first step, may recompile on the first step of a phase with another shape, and
never inside a phase. Checked on CPU with the `eager` backend and dynamo's
counters, for rank 0 of 3 (the rank that owns the fewest lanes and pads most)
through the tiny phase recipe: a batch-size ramp, seq_len 32 -> 64 (micro-batch
rows halve), lanes 4 -> 8 (the ranks exchange their states first).
"""

from __future__ import annotations

import torch
from helpers.train import PHASE_NAMES, PHASE_STEPS, ensure_sample_data, phase_recipe
from torch._dynamo.utils import counters

from torchtitan.config.job_config import load_job_config
from torchtitan.datasets.phase_timeline import DataTimeline
from torchtitan.models.llama3.args import get_model_args
from torchtitan.models.llama3.model import Transformer
from zephon import ZephonLoader, load_tokenizer, merge_rank_states

TOKENS = 192  # per micro-batch: 6 rows of 32, then 3 rows of 64
DP = 3


def test_compiled_blocks_recompile_at_most_once_per_phase(tmp_path, tokenizer_path):
    ensure_sample_data()
    recipe = phase_recipe(tmp_path)
    cfg = load_job_config(["--data.recipe", str(recipe), "--training.local_batch_tokens",
                           str(TOKENS)])  # fmt: skip
    plan = DataTimeline.from_config(cfg)
    tok = load_tokenizer(tokenizer_path)
    ranks = [
        ZephonLoader(recipe, tok, 32, 8, None, r, DP, micro_batch_tokens=TOKENS) for r in range(DP)
    ]
    torch.manual_seed(0)
    model = Transformer(get_model_args("debugmodel", vocab_size=tok.vocab_size, n_layers=2))
    model.init_weights()
    for block in model.layers.values():  # what training.compile does, on the eager backend
        block.compile(backend="eager")
    torch._dynamo.reset()
    counters.clear()
    compiles, shapes = [], []
    try:
        for step in range(1, PHASE_STEPS + 1):
            if ranks[0].needs_boundary_state:  # the trainer's hand-over at a lane change
                state = merge_rank_states([r.state_dict() for r in ranks])
                for r in ranks:
                    r.load_state_dict(state)
            batch = [r.next_batch() for r in ranks][0]
            before = counters["stats"]["unique_graphs"]
            phase = plan.phase_at(step)
            step_shapes = set()
            for mb in batch.micro_batches(plan.micro_rows(phase)):
                model(mb.input_ids, mb.positions).float().mean().backward()
                step_shapes.add(tuple(mb.input_ids.shape))
            compiles.append(counters["stats"]["unique_graphs"] - before)
            shapes.append(step_shapes)
    finally:
        for r in ranks:
            r.close()
    firsts = [i for i, name in enumerate(PHASE_NAMES) if i == 0 or name != PHASE_NAMES[i - 1]]
    # Compiles only on the first step of a phase, at most one there; and the
    # seq_len change did recompile (the counters do see it).
    assert all(n == 0 for i, n in enumerate(compiles) if i not in firsts), compiles
    assert all(compiles[i] <= 1 for i in firsts), compiles
    assert compiles[0] == 1 and compiles[PHASE_NAMES.index("long")] == 1, compiles
    # One shape per step and phase: the phase's rows of its seq_len, TOKENS tokens.
    for i, (name, step_shapes) in enumerate(zip(PHASE_NAMES, shapes, strict=True)):
        seq_len = plan.phase_at(i + 1).seq_len
        assert step_shapes == {(TOKENS // seq_len, seq_len)}, (i + 1, name, step_shapes)
