"""Lanes: which documents each lane reads and in what order (shuffle, mixing), and how
its documents become rows (packing)."""
