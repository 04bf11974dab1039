"""Prompt logprobs through chunked prefill against Hugging Face, and the structured-output matchers on the real
tokenizer."""
import torch

from sluice.core.sampling_params import SamplingParams
from sluice.core.step_plan import CachedRequest, NewRequest, StepPlan
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.runner.model_runner import PROMPT_LOGPROB_ROWS
from sluice.worker.sampling.structured_output import GrammarMatchers, load_llguidance_tokenizer

BLOCK_SIZE = 16
PHONE = r"\(\d{3}\) \d{3}-\d{4}"


def test_prompt_logprobs_through_chunked_prefill_match_hf(default_model_dir, hf_model, hf_tokenizer):
    prompt = hf_tokenizer("The quick brown fox jumps over the lazy dog while the cat sleeps.").input_ids
    engine = WorkerEngine.load(WorkerConfig(model=str(default_model_dir)))
    engine.init_cache(BLOCK_SIZE, 8)
    params = SamplingParams(temperature=0.0, prompt_logprobs=2, logprobs=1)
    received, computed, step = [], 0, 0
    while computed < len(prompt):
        num_tokens = min(5, len(prompt) - computed)
        new = [NewRequest("r", prompt, list(range(8)), 0, params)] if step == 0 else []
        cached = [] if step == 0 else [CachedRequest("r", [], computed, 8)]
        outcome = engine.execute(StepPlan(step, new, cached, {"r": num_tokens}))
        received.append(outcome.prompt_logprobs.by_request()["r"])
        computed, step = computed + num_tokens, step + 1
    with torch.inference_mode():
        reference = hf_model(torch.tensor([prompt])).logits[0].log_softmax(-1)
    token_ids = [t for chunk in received for t in chunk.token_ids]
    logprobs = torch.tensor([v for chunk in received for v in chunk.logprobs])
    top_ids = [t for chunk in received for t in chunk.top_token_ids]
    assert token_ids == prompt[1:]
    torch.testing.assert_close(logprobs, reference[torch.arange(len(prompt) - 1), prompt[1:]], atol=1e-4, rtol=0)
    assert top_ids == reference[:-1].topk(2).indices.flatten().tolist()
    assert outcome.logprobs.by_request()["r"].token_ids == [reference[-1].argmax().item()]


def test_prompt_logprobs_of_a_long_prefill_chunk_come_in_parts_and_match_hf(default_model_dir, hf_model,
                                                                           hf_tokenizer):
    """A prefill chunk longer than PROMPT_LOGPROB_ROWS projects its logits a part at a time; the parts join in order."""
    words = "the quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun".split()
    prompt = hf_tokenizer(" ".join(words[i * 7 % len(words)] for i in range(2 * PROMPT_LOGPROB_ROWS + 60))).input_ids
    assert len(prompt) > 2 * PROMPT_LOGPROB_ROWS + 1
    engine = WorkerEngine.load(WorkerConfig(model=str(default_model_dir)))
    engine.init_cache(BLOCK_SIZE, -(-len(prompt) // BLOCK_SIZE) + 1)
    params = SamplingParams(temperature=0.0, prompt_logprobs=3)
    blocks = list(range(-(-len(prompt) // BLOCK_SIZE) + 1))
    received = engine.execute(StepPlan(0, [NewRequest("r", prompt, blocks, 0, params)], [], {"r": len(prompt)}))
    with torch.inference_mode():
        reference = hf_model(torch.tensor([prompt])).logits[0].log_softmax(-1)[:-1]
    logprobs = received.prompt_logprobs.by_request()["r"]
    assert logprobs.token_ids == prompt[1:]
    torch.testing.assert_close(torch.tensor(logprobs.logprobs), reference[torch.arange(len(prompt) - 1), prompt[1:]],
                               atol=1e-4, rtol=0)
    assert logprobs.ranks == ((reference > reference.gather(1, torch.tensor(prompt[1:]).unsqueeze(1))).sum(1)
                              + 1).tolist()
    assert logprobs.top_token_ids == reference.topk(3).indices.flatten().tolist()


def test_grammar_mask_allows_only_the_choices_and_completes(default_model_dir, hf_tokenizer):
    vocab = len(hf_tokenizer)
    tokenizer = load_llguidance_tokenizer(default_model_dir, vocab, (hf_tokenizer.eos_token_id,))
    matchers = GrammarMatchers(lambda: tokenizer, vocab, torch.device("cpu"))
    matchers.add("free", SamplingParams(), [])
    matchers.add("city", SamplingParams(choice=["Paris", "Rome"]), [])
    allowed = matchers.allowed_tokens(["free", "city"])
    assert allowed[0].all()
    first_tokens = {hf_tokenizer.decode([t]) for t in allowed[1].nonzero().flatten().tolist()}
    assert first_tokens and all("Paris".startswith(text) or "Rome".startswith(text) for text in first_tokens)
    *head, last = hf_tokenizer("Rome", add_special_tokens=False).input_ids
    for token_id in head:
        assert matchers.advance(["free", "city"], [5, token_id], {}) == {}
    assert matchers.allowed_tokens(["city"])[0, last]
    assert matchers.advance(["free", "city"], [5, last], {}) == {"city": 1}  # nothing can follow: complete at once


def test_rows_with_proposals_are_masked_as_after_each_proposal(default_model_dir, hf_tokenizer):
    """A request's row j (speculative decoding) has the mask its grammar gives after the first j proposals, as a
    matcher that consumed them computes it; rows after a proposal the grammar rejects allow everything (acceptance
    ends at that proposal); accepted proposals and the sampled token advance the matcher."""
    vocab = len(hf_tokenizer)
    tokenizer = load_llguidance_tokenizer(default_model_dir, vocab, (hf_tokenizer.eos_token_id,))

    def matchers_after(output_ids: list[int]) -> GrammarMatchers:
        matchers = GrammarMatchers(lambda: tokenizer, vocab, torch.device("cpu"))
        matchers.add("free", SamplingParams(), [])
        matchers.add("phone", SamplingParams(regex=PHONE), output_ids)
        return matchers

    ids = hf_tokenizer("(555) 12x", add_special_tokens=False).input_ids
    valid = ids[:-1]
    assert hf_tokenizer.decode(ids[-1:]) == "x" and len(valid) >= 4
    speculating = matchers_after([])
    allowed = speculating.allowed_tokens(["free"] + ["phone"] * (len(ids) + 1), {"phone": ids})
    assert allowed[0].all()
    for j in range(len(valid) + 1):
        assert torch.equal(allowed[1 + j], matchers_after(valid[:j]).allowed_tokens(["phone"])[0]), j
    assert not allowed[len(valid)][ids[-1]] and allowed[len(ids) + 1].all()
    sampled = allowed[3].nonzero().flatten()[0].item()
    assert speculating.advance(["free", "phone"], [5, sampled], {"phone": valid[:2]}) == {}
    assert torch.equal(speculating.allowed_tokens(["phone"]),
                       matchers_after([*valid[:2], sampled]).allowed_tokens(["phone"]))
    assert speculating.take_errors() == {}
    *head, last = hf_tokenizer("Rome", add_special_tokens=False).input_ids
    speculating.add("city", SamplingParams(choice=["Paris", "Rome"]), [])
    assert speculating.advance(["city"], [5], {"city": [*head, last, 7]}) == {"city": len(head) + 1}


def test_grammar_that_no_token_continues_is_dropped_and_reported(default_model_dir, hf_tokenizer):
    """No token of the model spells the byte 0x14: the matcher fails when it computes the mask that would need one,
    and the request is reported once instead of sampling on unconstrained."""
    vocab = len(hf_tokenizer)
    tokenizer = load_llguidance_tokenizer(default_model_dir, vocab, (hf_tokenizer.eos_token_id,))
    matchers = GrammarMatchers(lambda: tokenizer, vocab, torch.device("cpu"))
    matchers.add("stuck", SamplingParams(regex="a\x14"), [])
    matchers.add("city", SamplingParams(choice=["Paris", "Rome"]), [])
    (a,) = hf_tokenizer("a", add_special_tokens=False).input_ids
    assert matchers.allowed_tokens(["stuck", "city"])[0].nonzero().flatten().tolist() == [a]
    assert matchers.take_errors() == {}
    matchers.advance(["stuck", "city"], [a, hf_tokenizer("Rome", add_special_tokens=False).input_ids[0]], {})
    allowed = matchers.allowed_tokens(["stuck", "city"])
    assert matchers.take_errors() == {"stuck": "no text the model's tokens can spell satisfies it"}
    assert matchers.take_errors() == {}
    assert allowed[1].any()
    assert matchers.allowed_tokens(["stuck"]) is None  # no matcher left for it: nothing more to report


def test_grammar_without_a_tokenizer_is_reported_not_ignored():
    matchers = GrammarMatchers(None, 100, torch.device("cpu"))
    matchers.add("r", SamplingParams(regex="[a-z]+"), [])
    matchers.add("free", SamplingParams(), [])
    assert matchers.take_errors() == {"r": "this worker has no tokenizer for structured output"}
    assert not matchers.active
