"""The model modules: the Llama-family decoder and its tensor-parallel part, the Gemma family over them, architectures,
rope, shards."""
