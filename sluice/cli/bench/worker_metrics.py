"""The vision encoder's share of the worker's step time over a timed run, from the worker's Prometheus histograms
scraped before and after it."""
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

STEP_SECONDS = "sluice:worker_step_seconds_sum"
ENCODER_SECONDS = "sluice:worker_vision_encoder_seconds_sum"


def step_time_sums(metrics_port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        families = text_string_to_metric_families(response.read().decode())
    return {sample.name: sample.value for family in families for sample in family.samples
            if sample.name in (STEP_SECONDS, ENCODER_SECONDS)}


def encoder_share(before: dict[str, float], after: dict[str, float]) -> float:
    return (after[ENCODER_SECONDS] - before[ENCODER_SECONDS]) / (after[STEP_SECONDS] - before[STEP_SECONDS])
