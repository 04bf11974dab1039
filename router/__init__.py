"""The public gRPC service: validation, tokenization, streaming detokenization, stop strings, routing."""
