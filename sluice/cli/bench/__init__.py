"""`sluice bench`: throughput, serving latency and batch-1 latency, through the gRPC stack or in process."""
