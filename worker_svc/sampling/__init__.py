"""Sampling on the device: per-request rows, penalties, grammars, speculative verification, logprobs."""
