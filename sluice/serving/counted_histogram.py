"""A Prometheus histogram for per-token hot paths: one call observes a value any number of times, counted in a plain
list and read when Prometheus scrapes (prometheus_client's Histogram takes a lock and scans its buckets for every
observation)."""
from bisect import bisect_left
from itertools import accumulate

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString


class CountedHistogram(Collector):
    def __init__(self, names: list[tuple[str, str]], labels: dict[str, str], buckets, registry: CollectorRegistry):
        """names: (name, documentation) pairs that each export the same observations (a series and its older
        name); buckets: the upper bounds, ascending (+Inf is added)."""
        self.names = names
        self.labels = labels
        self.bounds = list(buckets)
        self._counts = [0] * (len(self.bounds) + 1) + [0.0]  # per bucket, the +Inf one, then the sum
        registry.register(self)

    def observe(self, value: float, count: int = 1) -> None:
        self._counts[bisect_left(self.bounds, value)] += count
        self._counts[-1] += value * count

    def collect(self):
        counts = list(self._counts)  # one copy: a scrape from another thread reads buckets and sum of one moment
        cumulative = list(accumulate(counts[:-1]))
        buckets = [*zip(map(floatToGoString, self.bounds), cumulative), ("+Inf", cumulative[-1])]
        for name, documentation in self.names:
            family = HistogramMetricFamily(name, documentation, labels=list(self.labels))
            family.add_metric(list(self.labels.values()), buckets, counts[-1])
            yield family
