"""The worker's KV transfers between replicas (prefill/decode disaggregation), over NIXL."""
