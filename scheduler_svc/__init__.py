"""Control plane: request queues, paged KV block tables, prefix cache, preemption, step planning."""
