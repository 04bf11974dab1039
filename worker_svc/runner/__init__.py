"""The model runner: batch state, step inputs, CUDA graphs and the KV cache, from a StepPlan to the model."""
