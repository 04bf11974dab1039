import pytest
import torch

from sluice.core.sampling_params import SamplingParams
from sluice.kernels.candidate_draw import candidate_draw
from sluice.worker.sampling.ops import (TOP_K_CANDIDATES, RandomDraws, _drawn_on_gpu, drawn_tokens, sample,
                                        sampling_weights)
from sluice.worker.sampling.rows import SamplingRows
from sluice.worker.sampling.seeded_random import seeded_uniform

VOCAB, WIDTH = 300, 48  # a width that is no power of two: the kernel pads it
DRAWS_PER_ROW = 6


def _rows(num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits with ties (multiples of 1/4) and a few masked tokens, each row repeated DRAWS_PER_ROW times; and the
    per-row parameters as strided columns of one float table, as SamplingRows gathers them."""
    logits = (torch.randn(num_rows, VOCAB) * 2).mul_(4).round_().div_(4)
    logits[0, :5] = float("-inf")
    logits[1, :] = 0.5  # a row of ties only, where top-p's limit falls exactly on a token (test below)
    table = torch.stack([
        torch.rand(num_rows) + 0.5,  # temperature
        torch.rand(num_rows) * 0.7 + 0.3,  # top_p
        torch.rand(num_rows) * 0.2,  # min_p
    ], dim=1)
    table[1, 1] = 0.5
    table[2, 0] = 0.0  # a greedy row
    table[3:6, 1] = 1.0
    table[4:7, 2] = 0.0
    return logits.repeat_interleave(DRAWS_PER_ROW, 0), table.repeat_interleave(DRAWS_PER_ROW, 0)


@pytest.mark.parametrize("filters", ["top_k", "top_k top_p", "top_k min_p", "top_k top_p min_p"])
def test_draws_the_tokens_of_the_torch_path(device, filters):
    logits, table = _rows(16)
    batch = logits.shape[0]
    top_k = torch.randint(1, WIDTH // 2 + 1, (batch // DRAWS_PER_ROW,)).repeat_interleave(DRAWS_PER_ROW)
    top_k[:2 * DRAWS_PER_ROW] = WIDTH // 2  # row 1 keeps 24 tied tokens, top-p the first 12 of them
    draws = RandomDraws(temperature=table[:, 0], top_k=top_k, top_p=table[:, 1] if "top_p" in filters else None,
                        min_p=table[:, 2] if "min_p" in filters else None,
                        seeds=torch.zeros(batch, 2, dtype=torch.int64),
                        output_positions=torch.zeros(batch, dtype=torch.int64), filter_width=WIDTH)
    uniform = torch.rand(batch, dtype=torch.float64)
    uniform[:3] = torch.tensor([0.0, 1e-300, 1 - 2**-53], dtype=torch.float64)
    uniform[2 * DRAWS_PER_ROW - 1] = 0.999  # row 1's last kept token
    greedy_tokens = logits.argmax(dim=-1)
    token_ids, weights = sampling_weights(logits, draws)
    expected = torch.where(draws.temperature == 0, greedy_tokens, drawn_tokens(token_ids, weights, uniform))

    scaled = logits / torch.where(draws.temperature == 0, 1.0, draws.temperature).unsqueeze(1)
    values, candidates = scaled.topk(WIDTH, dim=-1)
    shuffled = torch.argsort(torch.rand(batch, WIDTH), dim=1)  # the kernel takes candidates in any order
    values, candidates = values.gather(1, shuffled), candidates.gather(1, shuffled)
    probs = (values - values.amax(dim=-1, keepdim=True)).exp_()
    on_device = [t.to(device) if t is not None else None for t in (
        values, candidates, probs, draws.top_k, draws.top_p, draws.min_p, uniform)]
    drawn = torch.where(draws.temperature == 0, greedy_tokens, candidate_draw(*on_device).cpu())
    assert torch.equal(drawn, expected)
    assert len(set(expected.tolist())) > batch // 4  # the draws spread over many tokens


def test_an_empty_batch(device):
    empty = torch.zeros(0, WIDTH, device=device)
    ids = torch.zeros(0, WIDTH, dtype=torch.int64, device=device)
    drawn = candidate_draw(empty, ids, empty, ids[:, 0], None, None, torch.zeros(0, device=device).double())
    assert drawn.shape == (0,)


def test_the_gpu_step_draws_what_the_cpu_step_draws(device):
    """sample's GPU branch (topk, then the kernel) over the rows SamplingRows gathers, against its torch branch; the
    draw from probabilities without filters likewise."""
    vocab = 2 * TOP_K_CANDIDATES
    rows = SamplingRows(vocab, (0,), device)
    settings = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=50, top_p=0.9),
                SamplingParams(temperature=1.2, top_k=5, min_p=0.05), SamplingParams(temperature=0.7, top_k=1)]
    request_ids = [f"r{i}" for i in range(12)]
    for i, request_id in enumerate(request_ids):
        rows.add(request_id, settings[i % len(settings)], seed=1000 + i, prompt_ids=[1], output_ids=[])
    tensors = rows.gather(request_ids, torch.tensor(rows.indices(request_ids), device=device))
    draws = tensors.draws
    assert draws.filter_width == 128  # a power of two, twice the largest top-k
    logits = (torch.randn(len(request_ids), vocab) * 3).to(device)
    drawn = _drawn_on_gpu(logits, logits.amax(dim=-1), draws, seeded_uniform(draws.seeds, draws.output_positions))
    assert torch.equal(torch.where(draws.temperature == 0, logits.argmax(dim=-1), drawn), sample(logits, tensors))
    draws.filter_width = None  # as if no row filtered: the kernel draws from the tempered logits
    draws.top_k = draws.top_p = draws.min_p = None
    drawn = _drawn_on_gpu(logits, logits.amax(dim=-1), draws, seeded_uniform(draws.seeds, draws.output_positions))
    assert torch.equal(torch.where(draws.temperature == 0, logits.argmax(dim=-1), drawn), sample(logits, tensors))
