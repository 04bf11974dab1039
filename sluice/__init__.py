"""Sluice: an LLM inference server split into a gRPC control plane and data plane."""
