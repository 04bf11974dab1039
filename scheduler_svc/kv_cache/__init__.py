"""The KV cache's bookkeeping: the block pool, block tables, prefix hashes and the prefix cache's events."""
