import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from sluice.serving.counted_histogram import CountedHistogram

BUCKETS = (0.01, 0.025, 0.1, 1.0)


def _exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


@pytest.mark.parametrize("observations", [[], [(0.01, 1), (0.02, 3), (0.5, 2), (7.0, 1), (0.0, 4)]])
def test_exposes_what_prometheus_clients_histogram_does(observations):
    counted, reference = CollectorRegistry(), CollectorRegistry()
    histogram = CountedHistogram([("sluice:latency_seconds", "Latency."), ("sluice:old_seconds", "Older name.")],
                                 {"model_name": "m"}, BUCKETS, counted)
    expected = [Histogram(name, "Latency." if name == "sluice:latency_seconds" else "Older name.", ["model_name"],
                          buckets=BUCKETS, registry=reference).labels(model_name="m")
                for name in ("sluice:latency_seconds", "sluice:old_seconds")]
    for value, count in observations:
        histogram.observe(value, count)
        for _ in range(count):
            for series in expected:
                series.observe(value)
    assert _exposition(counted) == _exposition(reference)
