"""Streams: each lane running, from its documents to its rows. A lane's accumulators
(lanes/) take their documents from the demand executor's feeds (demand/), over
the sources opened once for all lanes (context.py); a restore starts each lane
at its flush point (restore.py), and a phase boundary moves the lanes into the
next segment (segment_boundary.py)."""
