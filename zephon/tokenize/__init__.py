"""Tokenizing: the tokenizer, its special tokens, and long documents encoded in pieces."""
