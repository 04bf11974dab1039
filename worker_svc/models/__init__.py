"""The model modules: the Llama-family decoder and its tensor-parallel part, architectures, rope, shards."""
