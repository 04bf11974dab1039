import threading
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from sluice.client import text_request

ROUTER_SERIES = ["vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:time_per_output_token_seconds", "vllm:e2e_request_latency_seconds"]
SCHEDULER_SERIES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                    "vllm:gpu_cache_usage_perc", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
                    "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_queue_time_seconds",
                    "vllm:num_preemptions", "vllm:request_success"]


def _scrape(services, service: str) -> dict[str, float]:
    """Every sample of a service's /metrics, keyed by name and labels (without model_name)."""
    with urllib.request.urlopen(services.metrics_url(service), timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k not in ("model_name", "le"))
            if "le" not in sample.labels:
                samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def _families(services, service: str) -> set[str]:
    with urllib.request.urlopen(services.metrics_url(service), timeout=5) as response:
        return {family.name for family in text_string_to_metric_families(response.read().decode())}


def test_every_service_exposes_its_vllm_series(services):
    assert set(ROUTER_SERIES) <= _families(services, "router")
    assert set(SCHEDULER_SERIES) <= _families(services, "scheduler")
    assert {"sluice:worker_step_seconds", "vllm:iteration_tokens_total"} <= _families(services, "worker")


def test_the_worker_reports_its_warm_up(services):
    assert _scrape(services, "worker")["sluice:worker_warm_up_seconds"] > 0


def test_series_move_under_load(services):
    router_before, scheduler_before = _scrape(services, "router"), _scrape(services, "scheduler")
    prompt = "Write a poem about the sea, the wind and the long grey waves that break upon the shore."
    running_seen = []

    def watch_gauges():
        deadline = time.monotonic() + 20
        while not running_seen and time.monotonic() < deadline:
            now = _scrape(services, "scheduler")
            if now["vllm:num_requests_running"] > 0 and now["vllm:kv_cache_usage_perc"] > 0:
                running_seen.append(now)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_gauges)
    watcher.start()
    for _ in range(2):  # the second run hits the prefix cache
        services.client.generate(text_request(prompt, max_tokens=48, temperature=0.0, ignore_eos=True))
    watcher.join()
    assert running_seen, "vllm:num_requests_running and kv_cache_usage_perc never rose during a request"

    router, scheduler = _scrape(services, "router"), _scrape(services, "scheduler")

    def moved(samples, before, name) -> float:
        return samples[name] - before.get(name, 0.0)

    assert moved(router, router_before, "vllm:time_to_first_token_seconds_count") == 2
    assert moved(router, router_before, "vllm:e2e_request_latency_seconds_count") == 2
    assert moved(router, router_before, "vllm:inter_token_latency_seconds_count") >= 2 * 40
    assert moved(scheduler, scheduler_before, "vllm:generation_tokens_total") >= 2 * 48
    assert moved(scheduler, scheduler_before, "vllm:prompt_tokens_total") >= 2 * 16
    assert moved(scheduler, scheduler_before, "vllm:request_success_total{finished_reason=length}") == 2
    assert moved(scheduler, scheduler_before, "vllm:request_queue_time_seconds_count") == 2
    assert moved(scheduler, scheduler_before, "vllm:prefix_cache_queries_total") > 0
    assert moved(scheduler, scheduler_before, "vllm:prefix_cache_hits_total") >= 16
    deadline = time.monotonic() + 5
    while _scrape(services, "scheduler")["vllm:num_requests_running"] > 0:
        assert time.monotonic() < deadline, "vllm:num_requests_running stayed up after the requests finished"
        time.sleep(0.05)
