"""The scheduler's Prometheus series (vLLM names) that its requests' progress writes: tokens, phase times, outcomes.
Those its state holds are read at scrape time (sluice.scheduler.telemetry.load_metrics)."""
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sluice.serving.metric_buckets import REQUEST_SECONDS

KV_TRANSFER_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

FINISHED_REASONS = ("stop", "length", "abort")


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str):
        labels = {"model_name": model_name}

        def series(kind, name: str, documentation: str, **options):
            return kind(name, documentation, list(labels), registry=registry, **options).labels(**labels)

        self.prompt_tokens = series(Counter, "vllm:prompt_tokens", "Prefilled prompt tokens.")
        self.generation_tokens = series(Counter, "vllm:generation_tokens", "Generated tokens.")
        self.request_queue_time = series(Histogram, "vllm:request_queue_time_seconds",
                                         "Time from arrival to first scheduling.", buckets=REQUEST_SECONDS)
        self.request_prefill_time = series(Histogram, "vllm:request_prefill_time_seconds",
                                           "Time from first scheduling to the first token.", buckets=REQUEST_SECONDS)
        self.request_decode_time = series(Histogram, "vllm:request_decode_time_seconds",
                                          "Time from the first token to the last.", buckets=REQUEST_SECONDS)
        self.kv_transfer_bytes = series(Counter, "sluice:kv_transfer_bytes",
                                        "Bytes of KV blocks pulled from prefill replicas (every rank's).")
        self.kv_transfer_seconds = series(Histogram, "sluice:kv_transfer_seconds",
                                          "Time of one request's pull of KV blocks from a prefill replica.",
                                          buckets=KV_TRANSFER_SECONDS)
        self.kv_transfer_failures = series(Counter, "sluice:kv_transfer_failures",
                                           "Pulls of KV blocks that failed their request.")
        self.kv_pulls = series(Gauge, "sluice:kv_pulls", "Requests pulling their KV blocks from a prefill replica.")
        success = Counter("vllm:request_success", "Finished requests by finish reason.",
                          ["model_name", "finished_reason"], registry=registry)
        self.request_success = {reason: success.labels(model_name=model_name, finished_reason=reason)
                                for reason in FINISHED_REASONS}
