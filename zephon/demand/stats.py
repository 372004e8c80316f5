"""The counts of the demand side's work (read calls, documents and tokens tokenized,
images decoded, the lookahead's peak): what `work_summary` reports and what the
planner's estimates read."""

from __future__ import annotations

from dataclasses import dataclass

# The counts of SchedulerStats that make up documents and tokens "tokenized" in
# all: by the tokenizer, pretokenized, and documents with images.
DOC_COUNTS = ("docs_tokenized", "docs_pretokenized", "image_docs")
TOKEN_COUNTS = ("tokens_tokenized", "tokens_pretokenized", "image_tokens")


@dataclass(slots=True)
class SchedulerStats:
    """Counts of the scheduler's work since it started or was last reset."""

    docs_tokenized: int = 0
    tokens_tokenized: int = 0
    chars_tokenized: int = 0
    docs_pretokenized: int = 0
    tokens_pretokenized: int = 0
    read_calls: int = 0
    docs_read: int = 0
    encode_calls: int = 0
    docs_from_cache: int = 0
    tokens_from_cache: int = 0
    lookahead_peak_tokens: int = 0
    image_docs: int = 0  # documents of sources with images, made by the workers
    image_tokens: int = 0  # their tokens (text and image blocks)
    # images of the documents framed (with decode processes, their pixels may be to come)
    images_framed: int = 0

    def count_document(self, tokens: int, pretokenized: bool) -> None:
        """One document read (pretokenized) or tokenized outside the planner's calls."""
        if pretokenized:
            self.docs_pretokenized += 1
            self.tokens_pretokenized += tokens
        else:
            self.docs_tokenized += 1
            self.tokens_tokenized += tokens

    def tokens_per_doc(self) -> float:
        """Average tokens of a tokenized document (256 before any)."""
        return self.tokens_tokenized / self.docs_tokenized if self.docs_tokenized else 256
