"""The scheduler's series that its state already holds (queues, KV blocks, prefix cache, preemptions, speculation),
read when Prometheus scrapes instead of written on every engine step."""
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sluice.scheduler.scheduler import Scheduler

_USAGE = "Fraction of KV blocks in use (1 = full)."


class SchedulerLoadCollector(Collector):
    def __init__(self, scheduler: Scheduler, model_name: str):
        self.scheduler = scheduler
        self.model_name = model_name

    def collect(self):
        load = self.scheduler.get_load()
        blocks, images = self.scheduler.block_manager, self.scheduler.encoder_cache
        usage = load.num_used_blocks / load.num_total_blocks if load.num_total_blocks else 0.0
        for kind, name, documentation, value in (
            (GaugeMetricFamily, "vllm:num_requests_running", "Requests in the running batch.", load.num_running),
            (GaugeMetricFamily, "vllm:num_requests_waiting", "Requests waiting to be scheduled.", load.num_waiting),
            (GaugeMetricFamily, "vllm:kv_cache_usage_perc", _USAGE, usage),
            (GaugeMetricFamily, "vllm:gpu_cache_usage_perc", f"{_USAGE} The older name of kv_cache_usage_perc.", usage),
            (CounterMetricFamily, "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
             blocks.num_prefix_query_tokens),
            (CounterMetricFamily, "vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
             blocks.num_prefix_hit_tokens),
            (CounterMetricFamily, "vllm:num_preemptions", "Preemptions (blocks freed for recompute).",
             load.num_preemptions),
            (CounterMetricFamily, "sluice:encoder_cache_reads", "Images whose encoder outputs prompt chunks read.",
             images.num_reads),
            (CounterMetricFamily, "sluice:encoder_cache_hits", "Image reads whose encoder output the worker held.",
             images.num_hits),
            (CounterMetricFamily, "sluice:encoder_deferrals",
             "Request-steps whose chunk stopped before an image the step could not encode (encoder budget or "
             "encoder cache room).", images.num_deferrals),
            (GaugeMetricFamily, "sluice:kv_leases", "Finished prefill legs whose blocks are held for a decode "
             "replica.", len(self.scheduler.kv_leases)),
            (CounterMetricFamily, "sluice:kv_leases_expired", "Leases that ended without the decode replica's word.",
             self.scheduler.kv_leases.num_expired),
            (CounterMetricFamily, "vllm:spec_decode_num_drafts", "Request-steps with speculative proposals.",
             load.num_drafts),
            (CounterMetricFamily, "vllm:spec_decode_num_draft_tokens", "Proposed (draft) tokens.",
             load.num_draft_tokens),
            (CounterMetricFamily, "vllm:spec_decode_num_accepted_tokens", "Proposed tokens the model accepted.",
             load.num_accepted_tokens),
        ):
            family = kind(name, documentation, labels=["model_name"])
            family.add_metric([self.model_name], value)
            yield family
        per_position = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                           "Accepted proposals by their position in the proposal.",
                                           labels=["model_name", "position"])
        for position, count in enumerate(load.num_accepted_tokens_per_position):
            per_position.add_metric([self.model_name, str(position)], count)
        yield per_position
