"""Which of a step's tokens need logits: the last token of every request that samples (and, before it, the newest
token and each proposal but the last of a request with proposals, whose logits verify them), then, for requests that
asked for prompt logprobs, every position of the chunk whose next token is a prompt token."""
from dataclasses import dataclass, field

from sluice.worker.runner.batch_state import RequestState


@dataclass(slots=True)
class LogitsRows:
    sample_request_ids: list[str] = field(default_factory=list)  # their rows first: 1 + proposals each
    num_sample_rows: int = 0
    token_indices: list[int] = field(default_factory=list)  # into the step's flattened tokens, one per row
    prompt_groups: list[tuple[str, int, int]] = field(default_factory=list)  # (request id, rows, num_top), in order
    prompt_targets: list[int] = field(default_factory=list)  # the prompt token each prompt row predicts


def logits_rows(request_ids: list[str], states: list[RequestState], query_lens: list[int],
                num_proposed: dict[str, int]) -> LogitsRows:
    rows = LogitsRows()
    prompt_indices = []
    offset = 0
    for request_id, state, num_tokens in zip(request_ids, states, query_lens):
        start = state.num_computed_tokens
        proposed = num_proposed.get(request_id, 0)
        if start + num_tokens == state.num_tokens + proposed:
            rows.sample_request_ids.append(request_id)
            rows.token_indices += range(offset + num_tokens - 1 - proposed, offset + num_tokens)
            rows.num_sample_rows += 1 + proposed
        num_top = state.sampling_params.prompt_logprobs
        end = min(start + num_tokens, state.num_prompt_tokens - 1)
        if num_top is not None and end > start:
            rows.prompt_groups.append((request_id, end - start, num_top))
            rows.prompt_targets += state.token_ids[start + 1:end + 1]
            prompt_indices += range(offset, offset + end - start)
        offset += num_tokens
    rows.token_indices += prompt_indices
    return rows
