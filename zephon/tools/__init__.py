"""The `zephon` command line: validate, preview, hash, inspect, mixture, and the scan."""
