"""Plumbing every service shares: health and readiness, drain, auth, tracing, metrics, gRPC options."""
