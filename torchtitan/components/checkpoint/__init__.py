"""Checkpoints of this trainer: DCP step folders, their manifest, and the verify command.

- `manager`: saving and loading step folders (DCP files, the loader state
  beside them, the completion marker) and choosing the step to resume from;
- `manifest`: the `COMPLETE.json` manifest of a step and its verification;
- `verify`: `python -m torchtitan.components.checkpoint verify PATH`.

Only the light names are re-exported here: the launcher and the failure report
import `CheckpointError` without paying for torch's DCP at start-up.
"""

from torchtitan.components.checkpoint.manifest import COMPLETE_FILE, LOADER_FILE, CheckpointError

__all__ = ["COMPLETE_FILE", "LOADER_FILE", "CheckpointError"]
