"""Loading: checkpoints, random weights and FP8 scales in the worker's layout, and the models built on them."""
