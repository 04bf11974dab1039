import pytest
import torch


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Hugging Face transformers' greedy continuation, cut after the first EOS as the server stops there."""
    with torch.inference_mode():
        output = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False)
    return output[0, len(prompt_ids):].tolist()


class GreedyReferences:
    """hf_greedy of one model, each prompt generated once: greedy's first n tokens are the same however many follow,
    so a prompt is generated again only for more tokens than before, unless it already ended at EOS."""

    def __init__(self, model):
        self.model = model
        self._generated: dict[tuple[int, ...], tuple[int, list[int]]] = {}  # prompt -> (max_new_tokens, tokens)

    def __call__(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        asked, tokens = self._generated.get(tuple(prompt_ids), (0, []))
        if max_new_tokens > asked and len(tokens) == asked:
            tokens = hf_greedy(self.model, prompt_ids, max_new_tokens)
            self._generated[tuple(prompt_ids)] = (max_new_tokens, tokens)
        return tokens[:max_new_tokens]


def hf_constrained_greedy(model, tokenizer, regex: str, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy under a regex: each step's argmax among the tokens llguidance allows next, until EOS, the grammar's
    end or max_new_tokens."""
    import llguidance
    import llguidance.hf
    import llguidance.numpy

    vocab_size = model.config.vocab_size
    matcher = llguidance.LLMatcher(llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size),
                                   llguidance.LLMatcher.grammar_from_regex(regex))
    bitmask = llguidance.numpy.allocate_token_bitmask(1, vocab_size)
    ids, output = list(prompt_ids), []
    with torch.inference_mode():
        while len(output) < max_new_tokens:
            logits = model(torch.tensor([ids])).logits[0, -1]
            llguidance.numpy.fill_next_token_bitmask(matcher, bitmask)
            allowed = (torch.from_numpy(bitmask[0]).unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
            token_id = logits.masked_fill(~allowed.flatten()[:vocab_size].bool(), float("-inf")).argmax().item()
            output.append(token_id)
            ids.append(token_id)
            matcher.consume_token(token_id)
            if token_id == tokenizer.eos_token_id or matcher.is_stopped():
                break
    return output


def assert_logprobs_match_hf(result, prompt_ids: list[int], num_top: int, num_prompt_top: int | None, hf_model,
                             hf_tokenizer) -> None:
    """Each logprob of the result (prompt and output) is Hugging Face's float32 log-softmax at its position, with
    its rank, text and top alternatives; greedy tokens rank first."""
    all_ids = prompt_ids + list(result.token_ids)
    with torch.inference_mode():
        reference = hf_model(torch.tensor([all_ids])).logits[0].log_softmax(-1)
    prompt_entries = list(result.prompt_logprobs)
    assert len(prompt_entries) == (0 if num_prompt_top is None else len(prompt_ids) - 1)
    assert len(result.logprobs) == len(result.token_ids)
    first = 0 if prompt_entries else len(prompt_ids) - 1
    for position, entry in enumerate(prompt_entries + list(result.logprobs), start=first):
        expected = reference[position]
        assert entry.token_id == all_ids[position + 1]
        assert entry.token == hf_tokenizer.decode([entry.token_id])
        assert entry.logprob == pytest.approx(expected[entry.token_id].item(), abs=1e-3)
        assert entry.rank == int((expected > expected[entry.token_id]).sum()) + 1
        assert len(entry.top) == (num_top if position >= len(prompt_ids) - 1 else num_prompt_top)
        top_values, top_ids = expected.topk(len(entry.top))
        assert [token_id for token_id, _, _ in entry.top] == top_ids.tolist()
        assert [value for _, _, value in entry.top] == pytest.approx(top_values.tolist(), abs=1e-3)
    assert all(entry.rank == 1 for entry in result.logprobs)
