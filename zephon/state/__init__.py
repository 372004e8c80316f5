"""Checkpoint state and restore: the versioned state document, the flush log, where
lanes restart, and what a phase boundary or a lane-count change does to them."""
