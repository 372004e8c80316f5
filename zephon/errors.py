"""Error types. Every user-facing failure of the loader is a ZephonError whose
message names the file, field or value at fault and what was expected, so the
CLI and the trainer can print it without a traceback."""


class ZephonError(Exception):
    """Base class for errors that are the user's input, not a bug."""


class RecipeError(ZephonError):
    """A data recipe is malformed (unknown key, wrong type, bad value...)."""


class DataError(ZephonError):
    """A source file cannot be read as declared (bad line, missing field...)."""


class LayoutError(ZephonError):
    """Lanes, data-parallel size and batch sizes do not divide as required."""


class StateError(ZephonError):
    """A checkpointed loader state cannot be restored into this run."""


class ImageError(DataError):
    """An image record cannot be decoded as the recipe's pixel definition requires
    (not an image, truncated, too many pixels...); the message names the record."""
