"""The worker's sampling transforms against Hugging Face's logits processors on the same logits, and the seeded draw,
on the CPU and, where there is one, on a CUDA device."""
import pytest
import torch
from transformers.generation.logits_process import (LogitsProcessorList, MinNewTokensLengthLogitsProcessor,
                                                    MinPLogitsWarper, NoBadWordsLogitsProcessor,
                                                    RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from sluice.core.sampling_params import SamplingParams
from sluice.worker.sampling.ops import TOP_K_CANDIDATES, fixed_point, kept_tokens, process_logits, sample
from sluice.worker.sampling.rows import SamplingRows
from sluice.worker.sampling.seeded_random import seeded_uniform
from sluice.worker.sampling.speculative import ProposalRows, preceding_proposals
from sluice.worker.sampling.step import StepSampler
from sluice.worker.sampling.structured_output import GrammarMatchers

VOCAB = 512
EOS = 2


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> torch.device:
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device(request.param)


def _rows(requests: dict[str, tuple[SamplingParams, list[int], list[int]]], device: torch.device,
          seed: int = 0, vocab_size: int = VOCAB) -> SamplingRows:
    """requests: id -> (params, prompt ids, output ids); each request's seed is its params' seed or `seed`."""
    rows = SamplingRows(vocab_size, (EOS,), device)
    for request_id, (params, prompt, output) in requests.items():
        rows.add(request_id, params, params.seed if params.seed is not None else seed, prompt, output)
    return rows


def _gather(rows: SamplingRows, request_ids: list[str]):
    return rows.gather(request_ids, torch.tensor(rows.indices(request_ids), device=rows.device))


def _logits(num_rows: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    return (torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3).to(device)


def _hf(processors: list, logits: torch.Tensor, input_ids: list[int] | None = None) -> torch.Tensor:
    """Hugging Face's processors on the CPU; the result on the logits' device."""
    ids = torch.tensor([input_ids or [0]])
    return LogitsProcessorList(processors)(ids, logits.cpu().clone()).to(logits.device)


WARPER_CASES = [
    dict(top_k=1), dict(top_k=5), dict(top_k=100), dict(top_p=0.1), dict(top_p=0.5), dict(top_p=0.95),
    dict(min_p=0.05), dict(min_p=0.3), dict(top_k=40, top_p=0.8), dict(top_k=40, top_p=0.9, min_p=0.1),
]


def _hf_warpers(top_k: int = -1, top_p: float = 1.0, min_p: float = 0.0, temperature: float = 1.0) -> list:
    warpers = [TemperatureLogitsWarper(temperature)]
    if top_k > 0:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1:
        warpers.append(TopPLogitsWarper(top_p))
    if min_p > 0:
        warpers.append(MinPLogitsWarper(min_p))
    return warpers


def _assert_keeps_what_hf_keeps(token_ids: torch.Tensor, weights: torch.Tensor, hf_logits: torch.Tensor,
                                 case) -> None:
    """One row: the same tokens kept, with the same probabilities."""
    kept = token_ids[weights > 0]
    assert kept.tolist() == hf_logits.isfinite().nonzero().flatten().tolist(), case
    probs = (weights[weights > 0] / weights.sum()).float()
    torch.testing.assert_close(probs, hf_logits.softmax(dim=-1)[kept], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("width", [VOCAB, 256], ids=["sorted-vocabulary", "top-k-candidates"])
def test_top_k_top_p_min_p_match_hf_row_by_row(device, width):
    cases = [case for case in WARPER_CASES if width == VOCAB or 0 < case.get("top_k", 0) <= width // 2]
    logits = _logits(len(cases), device)
    top_k = torch.tensor([case.get("top_k", VOCAB) for case in cases], device=device)
    top_p = torch.tensor([case.get("top_p", 1.0) for case in cases], device=device)
    min_p = torch.tensor([case.get("min_p", 0.0) for case in cases], device=device)
    token_ids, weights = kept_tokens(logits.clone(), top_k, top_p, min_p, width)
    for row, case in enumerate(cases):
        expected = _hf(_hf_warpers(**case), logits[row:row + 1])[0]
        _assert_keeps_what_hf_keeps(token_ids[row], weights[row], expected, case)


def test_top_k_keeps_every_token_tied_with_the_kth_as_hf_does(device):
    logits = torch.tensor([[4.0, 1.0, 3.0, 3.0, 0.0, 3.0, 2.0, -1.0]], device=device)
    for width in (8, 6):
        token_ids, weights = kept_tokens(logits.clone(), torch.tensor([2], device=device),
                                         torch.tensor([1.0], device=device), torch.tensor([0.0], device=device), width)
        _assert_keeps_what_hf_keeps(token_ids[0], weights[0], _hf([TopKLogitsWarper(2)], logits)[0], width)


@pytest.mark.parametrize("temperature", [0.3, 1.0, 1.7])
def test_temperature_then_filters_match_hf(temperature, device):
    params = SamplingParams(temperature=temperature, top_k=50, top_p=0.9, min_p=0.02)
    tensors = _gather(_rows({"a": (params, [1], [])}, device), ["a"])
    logits = _logits(1, device)
    draws = tensors.draws
    scaled = logits / draws.temperature.unsqueeze(1)
    token_ids, weights = kept_tokens(scaled, draws.top_k, draws.top_p, draws.min_p, draws.filter_width)
    _assert_keeps_what_hf_keeps(token_ids[0], weights[0], _hf(_hf_warpers(50, 0.9, 0.02, temperature), logits)[0],
                                temperature)


def test_small_top_k_rows_look_at_the_candidates_and_draw_as_over_the_sorted_vocabulary(device):
    """A batch whose rows all have a small top-k skips the vocabulary sort; a row that needs the whole vocabulary
    (top-p alone) brings the sort back. The top-k rows draw the same tokens either way, also where logits tie (bf16
    logits tie often)."""
    vocab_size = 4 * TOP_K_CANDIDATES
    top_k_rows = {f"k{i}": (SamplingParams(temperature=1.0, top_k=k, top_p=p, seed=i), [1], [])
                  for i, (k, p) in enumerate([(1, 1.0), (20, 1.0), (50, 0.95), (200, 0.8), (512, 1.0)])}
    logits = (torch.randn(len(top_k_rows), vocab_size, generator=torch.Generator().manual_seed(1)) * 3)
    logits = logits.bfloat16().float().to(device)
    alone = _gather(_rows(top_k_rows, device, vocab_size=vocab_size), list(top_k_rows))
    assert alone.draws.filter_width == TOP_K_CANDIDATES
    with_top_p = {**top_k_rows, "p": (SamplingParams(temperature=1.0, top_p=0.9, seed=99), [1], [])}
    mixed = _gather(_rows(with_top_p, device, vocab_size=vocab_size), list(with_top_p))
    assert mixed.draws.filter_width == vocab_size
    for position in range(8):
        alone.draws.output_positions.fill_(position)
        mixed.draws.output_positions.fill_(position)
        tokens = sample(logits.clone(), alone)
        assert torch.equal(tokens, sample(torch.cat([logits, logits[:1]]), mixed)[:len(top_k_rows)])
        assert tokens[0] == logits[0].argmax()


def _sorted_reference(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                      min_p: torch.Tensor) -> torch.Tensor:
    """kept_tokens' weights by sorting the whole vocabulary (most likely first, ties by token id) and cutting the
    sorted cumulative sum, in token order."""
    values, token_ids = logits.sort(dim=-1, descending=True, stable=True)
    probs = (values - values[:, :1]).exp()
    probs = probs.masked_fill(values < values.gather(1, top_k.clamp(max=logits.shape[1]).sub(1).unsqueeze(1)), 0.0)
    weights = fixed_point(probs)
    cdf = weights.cumsum(dim=-1)
    limit = torch.where(top_p < 1, (top_p.double() * cdf[:, -1]).ceil().long(), cdf[:, -1])
    weights = weights.masked_fill((cdf - weights >= limit.unsqueeze(1)) | (probs < min_p.unsqueeze(1)), 0)
    return torch.zeros_like(weights).scatter_(1, token_ids, weights)


def _filter_batch(device: torch.device, vocab_size: int) -> tuple[torch.Tensor, ...]:
    """Rows of every kind: random, rounded (many ties), all equal with -0.0 among 0.0, masked with -inf; greedy-like
    rows (no filter), small and large top-k, top-p down to 1e-6 and up to 1, min-p; logits, top_k, top_p, min_p."""
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(12, vocab_size, generator=generator) * 3
    logits[3:6] = logits[3:6].round()
    logits[6] = 0.0
    logits[6, ::7] = -0.0
    logits[7, vocab_size // 3:] = float("-inf")
    logits[8] = logits[8].bfloat16().float()
    settings = [(vocab_size, 1.0, 0.0), (50, 0.95, 0.0), (vocab_size, 0.95, 0.0), (vocab_size, 1e-6, 0.0),
                (900, 0.5, 0.0), (vocab_size, 0.9, 0.05), (vocab_size, 0.3, 0.0), (vocab_size, 0.999999, 0.0),
                (vocab_size - 1, 1.0, 0.2), (3, 1.0, 0.0), (vocab_size, 0.8, 0.01), (1, 0.5, 0.5)]
    top_k, top_p, min_p = (torch.tensor(column, device=device) for column in zip(*settings))
    return logits.to(device), top_k, top_p.float(), min_p.float()


def test_sort_free_filters_keep_what_the_sorted_vocabulary_keeps(device):
    """Exactly the same weights, ties kept in token order, on rows of every kind in one batch."""
    vocab_size = 3000
    logits, top_k, top_p, min_p = _filter_batch(device, vocab_size)
    token_ids, weights = kept_tokens(logits.clone(), top_k, top_p, min_p, vocab_size)
    assert torch.equal(token_ids[0], torch.arange(vocab_size, device=device))
    assert torch.equal(weights, _sorted_reference(logits, top_k, top_p, min_p))
    assert (weights > 0).sum(dim=1)[[6, 9, 11]].tolist() == [int(0.3 * vocab_size) + 1, 3, 1]  # ties, in token order
    assert weights[6].nonzero().max() == int(0.3 * vocab_size)
    assert torch.equal(kept_tokens(logits.clone(), None, top_p, None, vocab_size)[1],
                       _sorted_reference(logits, torch.full_like(top_k, vocab_size), top_p, torch.zeros_like(min_p)))


def test_a_row_draws_the_same_alone_and_in_any_batch_whichever_path_it_takes(device):
    """Greedy, top-k, top-p, min-p and unfiltered rows, each sampled alone (its own path: none, top-k candidates or
    sort-free over the vocabulary) and all together (sort-free), at many output positions."""
    vocab_size = 4 * TOP_K_CANDIDATES
    settings = {"greedy": SamplingParams(temperature=0.0), "plain": SamplingParams(temperature=0.9, seed=1),
                "top_k": SamplingParams(temperature=1.0, top_k=40, seed=2),
                "top_k_top_p": SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=3),
                "top_p": SamplingParams(temperature=0.8, top_p=0.95, seed=4),
                "min_p": SamplingParams(temperature=1.2, min_p=0.1, seed=5),
                "large_top_k": SamplingParams(temperature=1.0, top_k=2000, top_p=0.99, seed=6)}
    logits = (torch.randn(len(settings), vocab_size, generator=torch.Generator().manual_seed(2)) * 3)
    logits = logits.bfloat16().float().to(device)
    requests = {name: (params, [1], []) for name, params in settings.items()}
    together = _gather(_rows(requests, device, vocab_size=vocab_size), list(settings))
    alone = [_gather(_rows({name: requests[name]}, device, vocab_size=vocab_size), [name]) for name in settings]
    assert [t.draws.filter_width if t.draws else "greedy" for t in alone] == [
        "greedy", None, 128, 128, vocab_size, vocab_size, vocab_size]  # twice the top-k, a power of two
    for position in range(16):
        together.draws.output_positions.fill_(position)
        for tensors in alone[1:]:
            tensors.draws.output_positions.fill_(position)
        drawn = sample(logits.clone(), together).tolist()
        assert drawn == [sample(logits[i:i + 1].clone(), tensors)[0].item() for i, tensors in enumerate(alone)]


@pytest.mark.parametrize("penalty", [0.7, 1.3, 2.0])
def test_repetition_penalty_matches_hf(penalty, device):
    prompt, output = [5, 6, 7, 7], [9, 5, 300]
    tensors = _gather(_rows({"a": (SamplingParams(repetition_penalty=penalty), prompt, output)}, device), ["a"])
    logits = _logits(1, device)
    ours = process_logits(logits.clone(), tensors)
    torch.testing.assert_close(ours, _hf([RepetitionPenaltyLogitsProcessor(penalty)], logits, prompt + output))


def test_presence_and_frequency_penalties_match_the_openai_formula(device):
    output = [9, 9, 9, 4, 300]
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    tensors = _gather(_rows({"a": (params, [4, 8], output)}, device), ["a"])
    logits = _logits(1, device)
    expected = logits.clone()
    for token in set(output):
        expected[0, token] -= 0.25 * output.count(token) + 0.5
    torch.testing.assert_close(process_logits(logits.clone(), tensors), expected)


def _penalised_like_hf(logits: torch.Tensor, params: SamplingParams, prompt: list[int],
                       output: list[int]) -> torch.Tensor:
    expected = _hf([RepetitionPenaltyLogitsProcessor(params.repetition_penalty)], logits, prompt + output)
    for token in set(output):
        expected[0, token] -= params.frequency_penalty * output.count(token) + params.presence_penalty
    return expected


def test_verification_rows_are_penalised_after_the_proposals_before_them(device):
    """Speculative decoding: a request's row j is penalised as if its first j proposals were output already (against
    Hugging Face and the OpenAI formula on that history); its accepted proposals and sampled token then join the
    history, the rejected ones leave no trace, and the history grows past its first width."""
    params = SamplingParams(repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.25)
    history = {"rep": (params, [4, 8], [9]), "plain": (SamplingParams(), [5], []), "other": (params, [3], [])}
    rows = _rows(history, device)
    names = list(history)
    index = torch.tensor(rows.indices(names), device=device)
    for step, (proposals, num_accepted) in enumerate([({"rep": [9, 7, 9], "other": [3]}, [2, 0, 1]),
                                                       ({"rep": [11] * 6}, [6, 0, 0]), ({}, [])]):
        spec = ProposalRows.of(names, proposals, device)
        preceding = preceding_proposals(spec)
        logits = _logits(len(spec.row_request_ids), device, seed=step)
        out = process_logits(logits.clone(), rows.gather(spec.row_request_ids, index[spec.row_request], preceding))
        for row, (name, first) in enumerate(zip(spec.row_request_ids, spec.first_rows_t[spec.row_request].tolist())):
            params, prompt, output = history[name]
            before = output + proposals.get(name, [])[:row - first]
            torch.testing.assert_close(out[row:row + 1], _penalised_like_hf(logits[row:row + 1], params, prompt, before))
        if not proposals:
            break
        accepted = torch.tensor(num_accepted, device=device)
        rows.record_accepted(index, preceding[spec.first_rows_t + accepted])
        sampled = torch.tensor([5, 6, 12], device=device)
        rows.record(index, sampled)
        for name, count, token in zip(names, num_accepted, sampled.tolist()):
            rows.accepted_on_host(name, count)
            history[name][2].extend([*proposals.get(name, [])[:count], token])


def test_penalties_follow_the_sampled_tokens_through_preemption_and_forks(device):
    """The history stays on the device and grows with each step's sampled tokens (past its first width); a request
    preempted and recomputed comes back with its output so far; two forks of one prompt keep their own outputs; rows
    without penalties in the batch stay untouched. Every step against Hugging Face and the OpenAI formula."""
    fork = SamplingParams(repetition_penalty=1.2, frequency_penalty=0.3)
    requests = {"rep": (SamplingParams(repetition_penalty=1.3), [5, 6, 7, 7], []),
                "freq": (SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), [4, 8], [9, 9]),
                "fork_a": (fork, [3, 4], []), "fork_b": (fork, [3, 4], []),
                "plain": (SamplingParams(), [5], [])}
    rows = _rows(requests, device)
    history = {name: (params, list(prompt), list(output)) for name, (params, prompt, output) in requests.items()}
    tokens = torch.Generator().manual_seed(4)
    for step in range(12):
        if step == 6:  # "rep" is preempted and recomputed; a new request takes "plain"'s row
            rows.remove("rep")
            rows.remove("plain")
            rows.add("plain2", SamplingParams(temperature=0.0), 0, [1], [])
            rows.add("rep", *history["rep"][:1], 0, *history["rep"][1:])
            history["plain2"] = (SamplingParams(), [1], [])
            del history["plain"]
        names = list(history)
        index = torch.tensor(rows.indices(names), device=device)
        logits = _logits(len(names), device, seed=step)
        out = process_logits(logits.clone(), rows.gather(names, index))
        for i, (params, prompt, output) in enumerate(history.values()):
            torch.testing.assert_close(out[i:i + 1], _penalised_like_hf(logits[i:i + 1], params, prompt, output))
        sampled = torch.randint(3, 12, (len(names),), generator=tokens)
        rows.record(index, sampled.to(device))
        for (_, _, output), token in zip(history.values(), sampled.tolist()):
            output.append(token)
    assert history["fork_a"][2] != history["fork_b"][2]


def test_logit_bias_matches_hf_sequence_bias(device):
    bias = {3: 5.0, 17: -2.5, 400: 0.75}
    tensors = _gather(_rows({"a": (SamplingParams(logit_bias=bias), [1], [])}, device), ["a"])
    logits = _logits(1, device)
    expected = _hf([SequenceBiasLogitsProcessor([[[token], value] for token, value in bias.items()])], logits)
    torch.testing.assert_close(process_logits(logits.clone(), tensors), expected)


@pytest.mark.parametrize("num_output", [0, 3, 4, 6])
def test_min_tokens_masks_eos_and_stop_ids_like_hf(num_output, device):
    params = SamplingParams(min_tokens=4, stop_token_ids=[11, 12])
    prompt, output = [1, 2, 3], list(range(20, 20 + num_output))
    tensors = _gather(_rows({"a": (params, prompt, output)}, device), ["a"])
    logits = _logits(1, device)
    expected = _hf([MinNewTokensLengthLogitsProcessor(len(prompt), 4, [EOS, 11, 12])], logits, prompt + output)
    torch.testing.assert_close(process_logits(logits.clone(), tensors), expected)


def test_penalties_and_bias_apply_per_row_in_a_mixed_batch(device):
    requests = {
        "plain": (SamplingParams(), [5], [6]),
        "penalised": (SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5), [5], [6, 6]),
        "biased": (SamplingParams(logit_bias={7: 3.0}), [5], [6]),
    }
    tensors = _gather(_rows(requests, device), list(requests))
    logits = _logits(3, device)
    out = process_logits(logits.clone(), tensors)
    assert torch.equal(out[0], logits[0])
    torch.testing.assert_close(out[1], _hf([RepetitionPenaltyLogitsProcessor(1.5)], logits[1:2], [5, 6, 6])[0]
                               - 0.5 * 2 * (torch.arange(VOCAB, device=device) == 6))
    assert out[2, 7] == logits[2, 7] + 3.0 and torch.equal(out[2, :7], logits[2, :7])


def test_sample_penalises_in_place_and_leaves_the_logits_as_they_were(device):
    """Each row's history holds its argmax, which a repetition penalty of 1e4 puts out of reach: the greedy rows take
    the argmax of the penalised logits, the sampled rows never draw it, and the logits are the raw ones again."""
    logits = _logits(4, device)
    top = logits.argmax(dim=-1).tolist()
    logits[:, top] = logits[:, top].abs() + 1  # every row's argmax is positive, so the penalty divides it
    top = logits.argmax(dim=-1).tolist()
    requests = {"greedy": (SamplingParams(temperature=0.0, repetition_penalty=1e4), [top[0]], []),
                "biased": (SamplingParams(temperature=0.0, repetition_penalty=1e4, logit_bias={3: 1.0}), [9],
                           [top[1]]),
                "plain": (SamplingParams(temperature=0.0), [top[2]], []),
                "sampled": (SamplingParams(temperature=0.1, repetition_penalty=1e4, seed=1), [top[3], 5], [])}
    tensors = _gather(_rows(requests, device), list(requests))
    raw = logits.clone()
    tokens = sample(logits, tensors)
    assert torch.equal(logits, raw)
    expected = process_logits(raw, tensors).argmax(dim=-1)
    assert tokens[:3].tolist() == expected[:3].tolist() and tokens[2] == top[2]
    assert tokens[0] != top[0] and tokens[1] != top[1] and tokens[3] != top[3]


def test_allowed_token_ids_restrict_only_their_row(device):
    requests = {"free": (SamplingParams(temperature=0.0), [1], []),
                "listed": (SamplingParams(temperature=0.0, allowed_token_ids=[3, 17, 40]), [1], []),
                "sampled": (SamplingParams(temperature=1.0, seed=3, allowed_token_ids=[8, 9]), [1], [])}
    tensors = _gather(_rows(requests, device), list(requests))
    logits = _logits(3, device)
    tokens = sample(logits.clone(), tensors).tolist()
    assert tokens[0] == logits[0].argmax()
    assert tokens[1] == [3, 17, 40][int(logits[1, [3, 17, 40]].argmax())]
    assert tokens[2] in (8, 9)


def test_all_greedy_batch_is_the_argmax_of_the_untouched_logits(device):
    requests = {f"r{i}": (SamplingParams(temperature=0.0), [1], []) for i in range(4)}
    tensors = _gather(_rows(requests, device), list(requests))
    logits = _logits(4, device)
    assert tensors.draws is None
    assert torch.equal(sample(logits.clone(), tensors), logits.argmax(dim=-1))


def test_top_k_1_equals_greedy(device):
    requests = {f"r{i}": (SamplingParams(temperature=1.0, top_k=1, seed=i), [1], []) for i in range(32)}
    tensors = _gather(_rows(requests, device), list(requests))
    logits = _logits(32, device, seed=3)
    assert torch.equal(sample(logits.clone(), tensors), logits.argmax(dim=-1))


def test_samples_never_fall_outside_the_top_p_set(device):
    logits = _logits(1, device, seed=5).expand(256, VOCAB).clone()
    requests = {f"r{i}": (SamplingParams(temperature=1.0, top_p=0.3, seed=i), [1], []) for i in range(256)}
    tensors = _gather(_rows(requests, device), list(requests))
    allowed = _hf([TopPLogitsWarper(0.3)], logits[:1])[0].isfinite()
    sampled = sample(logits.clone(), tensors)
    assert allowed[sampled].all()
    assert len(sampled.unique()) > 1


def test_seeded_draws_follow_the_distribution(device):
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], device=device)
    logits = torch.full((4000, VOCAB), float("-inf"), device=device)
    logits[:, :4] = probs.log()
    requests = {f"r{i}": (SamplingParams(temperature=1.0, seed=i), [1], []) for i in range(4000)}
    tensors = _gather(_rows(requests, device), list(requests))
    counts = torch.bincount(sample(logits, tensors), minlength=VOCAB)
    assert counts[4:].sum() == 0
    torch.testing.assert_close(counts[:4] / 4000, probs, atol=0.025, rtol=0)


def test_a_seeded_request_draws_the_same_whatever_else_is_in_the_batch(device):
    target = (SamplingParams(temperature=0.9, top_p=0.95, seed=1234), [1, 2], [])
    others = {f"o{i}": (SamplingParams(temperature=1.0 + i / 10, top_k=10 * (i + 1)), [3], []) for i in range(5)}
    target_logits = _logits(1, device, seed=11)
    outcomes = []
    for mix in (["t"], ["o0", "t", "o1"], ["o4", "o3", "o2", "t"], ["t", "o0"]):
        requests = {rid: target if rid == "t" else others[rid] for rid in mix}
        rows = _rows(requests, device, seed=len(mix))
        draws = []
        for _ in range(20):  # consecutive output positions
            index = torch.tensor(rows.indices(mix), device=device)
            tensors = rows.gather(mix, index)
            logits = _logits(len(mix), device, seed=len(draws))
            logits[mix.index("t")] = target_logits[0]
            tokens = sample(logits, tensors)
            rows.record(index, tokens)
            draws.append(int(tokens[mix.index("t")]))
        outcomes.append(draws)
    assert all(draws == outcomes[0] for draws in outcomes)
    assert len(set(outcomes[0])) > 1


def test_different_seeds_draw_differently(device):
    requests = {f"r{i}": (SamplingParams(temperature=1.0, seed=i), [1], []) for i in range(16)}
    tensors = _gather(_rows(requests, device), list(requests))
    assert len(sample(_logits(1, device).expand(16, VOCAB).clone(), tensors).unique()) > 4


def test_rows_are_reused_and_grow_past_their_capacity(device):
    rows = _rows({}, device)
    for i in range(40):
        rows.add(f"r{i}", SamplingParams(temperature=0.5, logit_bias={i: 1.0}, repetition_penalty=1.1), 0, [i], [])
    _gather(rows, [f"r{i}" for i in range(40)])  # uploads every row
    for i in range(0, 40, 2):
        rows.remove(f"r{i}")
    rows.add("late", SamplingParams(temperature=0.0, min_tokens=2), 0, [1], [])  # takes r38's row
    ids = ["r39", "late", "r1"]
    tensors = _gather(rows, ids)
    assert tensors.draws.temperature.tolist() == [0.5, 0.0, 0.5]
    assert 39 in tensors.penalties.token_ids[0].tolist() and 1 in tensors.penalties.token_ids[2].tolist()
    out = process_logits(torch.zeros(3, VOCAB, device=device), tensors)
    assert out[0, 39] == 1.0 and out[2, 1] == 1.0 and out[1, EOS] == float("-inf")
    assert out[1, 38] == 0.0  # r38's bias left the row with it


def test_logprobs_are_of_the_raw_logits_which_sampling_leaves_as_they_are(device):
    """Penalties, a logit bias and temperature change what a row draws from, not its logprobs; only the rows that
    asked get them, reduced from the logits the step was given."""
    requests = {"penalised": (SamplingParams(temperature=0.8, repetition_penalty=1.5, frequency_penalty=0.5,
                                             logprobs=3, seed=1), [5, 6], [6]),
                "quiet": (SamplingParams(temperature=1.0, logit_bias={7: 5.0}, seed=2), [5], []),
                "greedy": (SamplingParams(temperature=0.0, logit_bias={9: 30.0}, logprobs=0), [5], [])}
    sampler = StepSampler(_rows(requests, device), GrammarMatchers(None, VOCAB, device))
    names = list(requests)
    logits = _logits(3, device)
    raw = logits.clone()
    sample = sampler.sample(logits, names, torch.tensor(sampler.rows.indices(names), device=device))
    assert torch.equal(logits, raw)
    token_ids = sample.token_ids.tolist()
    logprobs_of = sampler.finish(sample, token_ids).logprobs.by_request()
    assert sorted(logprobs_of) == ["greedy", "penalised"] and token_ids[2] == 9
    expected = raw.log_softmax(dim=-1)
    for row, name in ((0, "penalised"), (2, "greedy")):
        logprobs, token = logprobs_of[name], token_ids[row]
        assert logprobs.token_ids == [token]
        assert logprobs.ranks == [int((raw[row] > raw[row, token]).sum()) + 1]
        torch.testing.assert_close(torch.tensor(logprobs.logprobs), expected[row, token:token + 1].cpu())
        num_top = requests[name][0].logprobs
        assert logprobs.top_token_ids == expected[row].topk(num_top).indices.tolist()
        torch.testing.assert_close(torch.tensor(logprobs.top_logprobs), expected[row].topk(num_top).values.cpu())


def test_seeded_uniform_is_exact_integer_arithmetic_on_every_device(device):
    seeds = torch.tensor([[0, 0], [2**32 - 1, 2**32 - 1], [12345, 678]])
    positions = torch.tensor([0, 2**31, 7])
    on_device = seeded_uniform(seeds.to(device), positions.to(device)).cpu()
    assert torch.equal(on_device, seeded_uniform(seeds, positions))
    assert ((on_device > 0) & (on_device < 1)).all()


def test_bad_words_match_hf_and_follow_the_sampled_tokens(device):
    """One-token words are always banned, longer ones only right after their other tokens; the rows keep their own
    output history on the device, fed by each step's sampled tokens."""
    words = {"short": [[7], [11]], "long": [[3, 5], [4, 5, 9], [6, 6, 6, 6]], "none": []}
    outputs = {"short": [1], "long": [8, 3], "none": [3]}
    requests = {name: (SamplingParams(temperature=0.0, bad_words_token_ids=words[name]), [1], outputs[name])
                for name in words}
    rows = _rows(requests, device)
    names = list(requests)
    index = torch.tensor(rows.indices(names), device=device)
    banned_in_long = []
    for step, sampled in enumerate([[0, 4, 0], [0, 6, 0], [0, 6, 0], [0, 6, 0], [0, 0, 0]]):
        logits = _logits(3, device, seed=step)
        out = process_logits(logits.clone(), rows.gather(names, index))
        banned_in_long.append(out[1].isinf().nonzero().flatten().tolist())
        for i, name in enumerate(names):
            processor = [NoBadWordsLogitsProcessor(words[name], eos_token_id=EOS)] if words[name] else []
            assert torch.equal(out[i:i + 1], _hf(processor, logits[i:i + 1], outputs[name]))
        rows.record(index, torch.tensor(sampled, device=device))
        for name, token in zip(names, sampled):
            outputs[name].append(token)
    assert banned_in_long == [[5], [], [], [], [6]]  # 5 right after 3, 6 right after 6 6 6


@pytest.mark.parametrize("stepped", [False, True], ids=["before_a_step", "after_a_step"])
def test_a_reused_row_forgets_its_bad_words(device, stepped):
    rows = _rows({"banned": (SamplingParams(temperature=0.0, bad_words_token_ids=[[7]]), [1], [])}, device)
    if stepped:
        _gather(rows, ["banned"])
    rows.remove("banned")
    rows.add("fresh", SamplingParams(temperature=0.0), 0, [1], [])
    _gather(rows, ["fresh"])  # uploads the cleared row alone
    rows.add("other", SamplingParams(temperature=0.0, bad_words_token_ids=[[9]]), 0, [1], [])
    logits = _logits(2, device)
    out = process_logits(logits.clone(), _gather(rows, ["fresh", "other"]))
    assert torch.equal(out[0], logits[0]) and out[1].isinf().nonzero().flatten().tolist() == [9]


def test_a_row_reused_before_any_step_forgets_its_logit_bias(device):
    rows = _rows({"biased": (SamplingParams(temperature=0.0, logit_bias={7: 50.0}), [1], [])}, device)
    rows.remove("biased")
    rows.add("fresh", SamplingParams(temperature=0.0), 0, [1], [])
    rows.add("other", SamplingParams(temperature=0.0, logit_bias={9: 1.0}), 0, [1], [])
    logits = _logits(2, device)
    out = process_logits(logits.clone(), _gather(rows, ["fresh", "other"]))
    assert torch.equal(out[0], logits[0])
