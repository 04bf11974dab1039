"""Data plane: weights, KV cache tensors and sampling; runs one engine step per StepRequest."""
