"""The recipe and what it resolves to: the TOML spec, its phases over steps, the layout of
lanes over data-parallel ranks, and one rank's view of both."""
