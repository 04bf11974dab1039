from dataclasses import dataclass, field


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
