"""Speculative decoding in the scheduler: the proposal policy and the ngram proposer."""
