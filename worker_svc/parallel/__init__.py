"""Tensor parallelism: a rank's process group and the collectives the model and the runner use."""
