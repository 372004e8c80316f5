"""Global batch digests: the proof that two runs trained on the same bytes.

Each lane hashes its own rows for a step; the global digest hashes the lane
digests in canonical lane order. Ranks therefore exchange 32 bytes per lane,
and the result does not depend on how lanes were spread over ranks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def rows_digest(tokens: np.ndarray, positions: np.ndarray) -> bytes:
    """SHA-256 of packed rows: token ids then positions, little-endian int32."""
    h = hashlib.sha256()
    # The arrays' own buffers, not bytes copies of them.
    h.update(np.ascontiguousarray(tokens, dtype="<i4"))
    h.update(np.ascontiguousarray(positions, dtype="<i4"))
    return h.digest()


def global_batch_digest(unit_digests: Sequence[bytes]) -> str:
    """Hex SHA-256 over per-lane (or per-row) digests in canonical order."""
    h = hashlib.sha256()
    for d in unit_digests:
        if len(d) != 32:
            raise ValueError(f"expected 32-byte digests, got {len(d)} bytes")
        h.update(d)
    return h.hexdigest()
