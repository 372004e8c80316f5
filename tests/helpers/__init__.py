"""What the tests share besides conftest.py's fixtures, imported as `helpers.<module>`
(pytest's `pythonpath` puts tests/ on the path; a test module never imports another):

- `corpus`: the committed tokenizer and deterministic synthetic documents;
- `loader`: D ranks of the Zephon loader simulated in one process, digests, states;
- `packing`: a stand-in lane of numbered documents for the packers;
- `images`: exact PNGs, encoded test images and WebDataset shards;
- `golden`: the golden-digest cases (the committed files are in tests/golden/);
- `train`: the test job through torchrun or run_train.sh, its logs and checkpoints;
- `vlm`: a tiny vision-language model and the worker of its multi-process test;
- `hf_llama`: tiny Hugging Face Llama models for the weight conversion tests;
- `s3_server`: moto's S3 server and a proxy that fails a share of requests;
- `spawned`: how a test's own spawned rank ends (no gloo teardown);
- `hf_logits_harness`: run by torchrun (by path), not imported.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
GOLDEN = TESTS / "golden"
