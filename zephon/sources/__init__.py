"""Source access: random access to the documents of one recipe source.

One module per storage format (jsonl, parquet, hf, tokens), gzip random
access (gzipped), byte access to local and remote files (storage, remote),
the cache of derived metadata (cache) and the SourceReader that addresses all
files of a source by one document index (reader).
"""

from zephon.sources.cache import default_cache_dir
from zephon.sources.reader import SourceReader

__all__ = ["SourceReader", "default_cache_dir"]
