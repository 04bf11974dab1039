"""The scheduler's links to its workers: a client per rank, the replica's group, their supervision."""
