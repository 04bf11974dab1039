"""Prefill/decode disaggregation on the control plane: a prefill replica's leases, a decode replica's pulls."""
