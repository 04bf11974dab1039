"""Log probabilities of sampled and prompt tokens, packed: one request's (Logprobs) or several (LogprobRows)."""
from dataclasses import dataclass, field

MAX_LOGPROBS = 20  # the most alternatives a request may ask for, per token (logprobs and prompt_logprobs)


@dataclass(slots=True)
class Logprobs:
    """Log probabilities of consecutive tokens, packed: token i is token_ids[i], with logprobs[i] and ranks[i]
    (1 = the most likely), and its num_top most likely alternatives at top_*[i * num_top:(i + 1) * num_top]."""

    num_top: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    top_token_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    def extend(self, other: "Logprobs") -> None:
        self.token_ids += other.token_ids
        self.logprobs += other.logprobs
        self.ranks += other.ranks
        self.top_token_ids += other.top_token_ids
        self.top_logprobs += other.top_logprobs

    def slice(self, start: int, end: int | None = None) -> "Logprobs":
        end = len(self) if end is None else end
        top_start, top_end = start * self.num_top, end * self.num_top
        return Logprobs(self.num_top, self.token_ids[start:end], self.logprobs[start:end], self.ranks[start:end],
                        self.top_token_ids[top_start:top_end], self.top_logprobs[top_start:top_end])


@dataclass(slots=True)
class LogprobRows:
    """Several requests' Logprobs one after another, packed: request_ids[i] owns the next num_rows[i] entries of
    token_ids, logprobs and ranks, and the next num_rows[i] * num_tops[i] of top_token_ids and top_logprobs."""

    request_ids: list[str] = field(default_factory=list)
    num_rows: list[int] = field(default_factory=list)
    num_tops: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    top_token_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)

    @classmethod
    def packed(cls, request_ids: list[str], parts: list[Logprobs]) -> "LogprobRows":
        return cls(request_ids, [len(part) for part in parts], [part.num_top for part in parts],
                   [t for part in parts for t in part.token_ids], [v for part in parts for v in part.logprobs],
                   [r for part in parts for r in part.ranks], [t for part in parts for t in part.top_token_ids],
                   [v for part in parts for v in part.top_logprobs])

    def unpacked(self) -> list[Logprobs]:
        """Each request's Logprobs, in order."""
        parts, row, top = [], 0, 0
        for num_rows, num_top in zip(self.num_rows, self.num_tops):
            row_end, top_end = row + num_rows, top + num_rows * num_top
            parts.append(Logprobs(num_top, self.token_ids[row:row_end], self.logprobs[row:row_end],
                                  self.ranks[row:row_end], self.top_token_ids[top:top_end],
                                  self.top_logprobs[top:top_end]))
            row, top = row_end, top_end
        return parts

    def by_request(self) -> dict[str, Logprobs]:
        return dict(zip(self.request_ids, self.unpacked()))
