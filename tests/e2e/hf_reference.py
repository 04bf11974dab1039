import torch


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Hugging Face transformers' greedy continuation, cut after the first EOS as the server stops there."""
    with torch.inference_mode():
        output = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False)
    return output[0, len(prompt_ids):].tolist()


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
