"""vLLM's engine protocol (vllm.grpc.engine) on the router, for gateways such as smg."""
