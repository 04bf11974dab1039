"""The scheduler's Prometheus series (vLLM names): queues, KV cache, prefix cache, tokens, preemptions, outcomes."""
from itertools import zip_longest

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scheduler_svc.outputs import LoadSnapshot
from sluice.serving.metric_buckets import REQUEST_SECONDS

FINISHED_REASONS = ("stop", "length", "abort")


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str):
        labels = {"model_name": model_name}

        def series(kind, name: str, documentation: str, **options):
            return kind(name, documentation, list(labels), registry=registry, **options).labels(**labels)

        self.num_requests_running = series(Gauge, "vllm:num_requests_running", "Requests in the running batch.")
        self.num_requests_waiting = series(Gauge, "vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_cache_usage = series(Gauge, "vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).")
        self.gpu_cache_usage = series(Gauge, "vllm:gpu_cache_usage_perc",
                                      "Fraction of KV blocks in use (the older name of kv_cache_usage_perc).")
        self.prefix_cache_queries = series(Counter, "vllm:prefix_cache_queries",
                                           "Prompt tokens looked up in the prefix cache.")
        self.prefix_cache_hits = series(Counter, "vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.prompt_tokens = series(Counter, "vllm:prompt_tokens", "Prefilled prompt tokens.")
        self.generation_tokens = series(Counter, "vllm:generation_tokens", "Generated tokens.")
        self.num_preemptions = series(Counter, "vllm:num_preemptions", "Preemptions (blocks freed for recompute).")
        self.request_queue_time = series(Histogram, "vllm:request_queue_time_seconds",
                                         "Time from arrival to first scheduling.", buckets=REQUEST_SECONDS)
        self.request_prefill_time = series(Histogram, "vllm:request_prefill_time_seconds",
                                           "Time from first scheduling to the first token.", buckets=REQUEST_SECONDS)
        self.request_decode_time = series(Histogram, "vllm:request_decode_time_seconds",
                                          "Time from the first token to the last.", buckets=REQUEST_SECONDS)
        success = Counter("vllm:request_success", "Finished requests by finish reason.",
                          ["model_name", "finished_reason"], registry=registry)
        self.request_success = {reason: success.labels(model_name=model_name, finished_reason=reason)
                                for reason in FINISHED_REASONS}
        self.spec_decode_num_drafts = series(Counter, "vllm:spec_decode_num_drafts",
                                             "Request-steps with speculative proposals.")
        self.spec_decode_num_draft_tokens = series(Counter, "vllm:spec_decode_num_draft_tokens",
                                                   "Proposed (draft) tokens.")
        self.spec_decode_num_accepted_tokens = series(Counter, "vllm:spec_decode_num_accepted_tokens",
                                                      "Proposed tokens the model accepted.")
        self._accepted_per_position = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted proposals by their position in the proposal.",
            ["model_name", "position"], registry=registry)
        self._model_name = model_name
        self._counted_queries = self._counted_hits = self._counted_preemptions = 0
        self._counted_spec = (0, 0, 0)
        self._counted_per_position: list[int] = []

    def observe_load(self, load: LoadSnapshot, num_prefix_query_tokens: int, num_prefix_hit_tokens: int) -> None:
        usage = load.num_used_blocks / load.num_total_blocks if load.num_total_blocks else 0.0
        self.num_requests_running.set(load.num_running)
        self.num_requests_waiting.set(load.num_waiting)
        self.kv_cache_usage.set(usage)
        self.gpu_cache_usage.set(usage)
        self.prefix_cache_queries.inc(num_prefix_query_tokens - self._counted_queries)
        self.prefix_cache_hits.inc(num_prefix_hit_tokens - self._counted_hits)
        self.num_preemptions.inc(load.num_preemptions - self._counted_preemptions)
        self._counted_queries = num_prefix_query_tokens
        self._counted_hits = num_prefix_hit_tokens
        self._counted_preemptions = load.num_preemptions
        self._observe_speculation(load)

    def _observe_speculation(self, load: LoadSnapshot) -> None:
        counted = (load.num_drafts, load.num_draft_tokens, load.num_accepted_tokens)
        for series, now, before in zip((self.spec_decode_num_drafts, self.spec_decode_num_draft_tokens,
                                        self.spec_decode_num_accepted_tokens), counted, self._counted_spec):
            series.inc(now - before)
        self._counted_spec = counted
        per_position = load.num_accepted_tokens_per_position
        for position, (now, before) in enumerate(zip_longest(per_position, self._counted_per_position, fillvalue=0)):
            self._accepted_per_position.labels(model_name=self._model_name, position=str(position)).inc(now - before)
        self._counted_per_position = list(per_position)
