"""The router's Prometheus series (vLLM names): latencies as the client sees them."""
from prometheus_client import CollectorRegistry, Histogram

from sluice.serving.counted_histogram import CountedHistogram
from sluice.serving.metric_buckets import INTER_TOKEN_SECONDS, REQUEST_SECONDS, TIME_TO_FIRST_TOKEN_SECONDS


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str):
        def histogram(name: str, documentation: str, buckets) -> Histogram:
            return Histogram(name, documentation, ["model_name"], buckets=buckets,
                             registry=registry).labels(model_name=model_name)

        self.time_to_first_token = histogram("vllm:time_to_first_token_seconds", "Time to first token.",
                                             TIME_TO_FIRST_TOKEN_SECONDS)
        self.inter_token_latency = CountedHistogram(
            [("vllm:inter_token_latency_seconds", "Time between output tokens."),
             ("vllm:time_per_output_token_seconds", "Time per output token (the older name of the inter-token "
                                                    "latency).")],
            {"model_name": model_name}, INTER_TOKEN_SECONDS, registry)
        self.e2e_request_latency = histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.",
                                             REQUEST_SECONDS)

    def observe_tokens(self, num_tokens: int, seconds_since_last: float) -> None:
        """Tokens that arrived together share the time since the last ones."""
        self.inter_token_latency.observe(seconds_since_last / num_tokens, num_tokens)
