"""Optional Weights & Biases logging (`[metrics] enable_wandb`), beside TensorBoard.

The run lives in `<dump_folder>/wandb/`. Set WANDB_MODE=offline to log without a
network (sync later with `wandb sync`); WANDB_PROJECT / WANDB_ENTITY / WANDB_API_KEY
and the other WANDB_* variables work as usual.
"""

from __future__ import annotations

import os
from typing import Any

from torchtitan.config.job_config import ConfigError


class WandbSink:
    """One wandb run on rank 0."""

    def __init__(self, dump_folder: str, project: str, config: dict[str, Any] | None = None):
        try:
            import wandb
        except ImportError:
            raise ConfigError(
                "metrics.enable_wandb = true needs the wandb package "
                "(pip install -e '.[wandb]', or pip install wandb)"
            ) from None
        os.makedirs(dump_folder, exist_ok=True)
        self._wandb = wandb
        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", project),
                dir=dump_folder,
                config=config or {},
            )
        except Exception as exc:  # wandb raises its own error types (login, network)
            raise ConfigError(
                f"metrics.enable_wandb: wandb could not start a run: {exc}; without a network "
                "or an API key set WANDB_MODE=offline"
            ) from None

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()
