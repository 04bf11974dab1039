"""Image inputs in the scheduler: their admission checks and the bookkeeping of the worker's encoder cache."""
