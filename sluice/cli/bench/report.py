"""Per-request timings of a benchmark run and their summary: throughput, TTFT, TPOT and ITL percentiles."""
import statistics
from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestTrace:
    """When one request was sent and when each of its output tokens arrived (perf_counter seconds)."""

    sent_at: float
    num_prompt_tokens: int
    token_times: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.sent_at

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def tpot(self) -> float | None:
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)


def percentiles(values: list[float], points=(50, 90, 99)) -> dict[str, float]:
    if not values:
        return {f"p{p}": float("nan") for p in points}
    ordered = sorted(values)
    return {f"p{p}": ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] for p in points}


def summarize(traces: list[RequestTrace], duration: float) -> dict:
    output_tokens = sum(len(t.token_times) for t in traces)
    prompt_tokens = sum(t.num_prompt_tokens for t in traces)
    return {
        "requests": len(traces),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "duration_s": duration,
        "requests_per_s": len(traces) / duration,
        "output_tokens_per_s": output_tokens / duration,
        "total_tokens_per_s": (output_tokens + prompt_tokens) / duration,
        "ttft_ms": {k: v * 1000 for k, v in percentiles([t.ttft for t in traces if t.token_times]).items()},
        "tpot_ms": {k: v * 1000 for k, v in percentiles([t.tpot for t in traces if t.tpot is not None]).items()},
        "itl_ms": {k: v * 1000 for k, v in percentiles([x for t in traces for x in t.itls]).items()},
        "mean_ttft_ms": statistics.fmean(t.ttft for t in traces if t.token_times) * 1000 if traces else float("nan"),
    }


def format_summary(title: str, summary: dict) -> str:
    lines = [f"== {title}",
             f"requests: {summary['requests']} in {summary['duration_s']:.2f} s  "
             f"({summary['requests_per_s']:.2f} req/s)",
             f"output tokens/s: {summary['output_tokens_per_s']:.1f}   total tokens/s: "
             f"{summary['total_tokens_per_s']:.1f}"]
    for name in ("ttft_ms", "tpot_ms", "itl_ms"):
        if name in summary:
            values = "  ".join(f"{k} {v:.2f}" for k, v in summary[name].items())
            lines.append(f"{name[:-3].upper():5} ms: {values}")
    return "\n".join(lines)
