"""The conventional per-rank loader ("hf"), kept as the baseline Zephon is compared against.

It behaves the way a typical Hugging Face `datasets` pipeline in a trainer does:
load and mix the sources, shuffle once, give each data-parallel rank its own
contiguous shard with `split_dataset_by_node`, then tokenize and pack that shard
into rows on the rank. Every rank keeps its own cursor and token buffer.

Consequences, which are the point of the baseline:

* the rows a rank sees, and so the global batch of a step, depend on the
  number of data-parallel ranks;
* the checkpointed state is per rank and cannot be redistributed, so a resume
  at another data-parallel size is refused (mode "refuse"), or approximated by
  skipping the globally consumed number of rows in the new shards (mode
  "skip"), which trains on a different data order.

Row format: each row has `seq_len + 1` tokens (documents concatenated, each
followed by the `<|endoftext|>` id, no padding; documents may span rows) and
per-token positions that restart at 0 at every document start and at every
row start. `Batch.step` is 0 for the first batch of a run and continues
across resumes.

Modules: `corpus` (loading and mixing with `datasets`), `packing` (the
per-rank packing stream), `state_codec` (its state as JSON), `loader` (the
loader the trainer's adapter drives).
"""

from torchtitan.datasets.hf_baseline.corpus import default_cache_dir, load_mixed_corpus
from torchtitan.datasets.hf_baseline.loader import (
    LOADER_NAME,
    RESUME_MODES,
    STATE_VERSION,
    HFBaselineLoader,
)

__all__ = [
    "LOADER_NAME",
    "RESUME_MODES",
    "STATE_VERSION",
    "HFBaselineLoader",
    "default_cache_dir",
    "load_mixed_corpus",
]
