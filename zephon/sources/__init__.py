"""Source access: random access to the documents of one recipe source.

One module per storage format (jsonl, parquet, hf, tokens, webdataset), each
registering itself in the format registry (formats) with a factory of its
parts (part: the SourcePart protocol); gzip random access (gzipped), byte
access to local and remote files (storage, remote), the cache of derived
metadata (cache) and the SourceReader that addresses all parts of a source by
one document index (reader). docs/adding_a_source_format.md: adding a format.
"""

from zephon.sources.cache import default_cache_dir
from zephon.sources.formats import (
    SourceFormat,
    format_names,
    get_format,
    register_format,
    unregister_format,
)
from zephon.sources.gzipped import clear_chunk_cache
from zephon.sources.part import SourcePart
from zephon.sources.reader import SourceReader

__all__ = [
    "SourceFormat",
    "SourcePart",
    "SourceReader",
    "clear_chunk_cache",
    "default_cache_dir",
    "format_names",
    "get_format",
    "register_format",
    "unregister_format",
]
