"""The GPU's draw over the whole vocabulary (threshold searches, then kernels.nucleus_draw) against the torch path's
kept weights and draw, with many tied logits, where top-p's tie rule decides."""
import pytest
import torch

from sluice.worker.sampling.ops import RandomDraws, _drawn_over_the_vocabulary_on_gpu, drawn_tokens, kept_tokens

VOCAB = 3000  # one whole block of 2048 and a part
DRAWS_PER_ROW = 4


@pytest.mark.parametrize("filters", ["top_p", "top_p min_p", "min_p", "top_k", "top_k top_p min_p"])
def test_draws_the_tokens_of_the_torch_path(device, filters):
    rows = 10
    logits = (torch.randn(rows, VOCAB) * 3).mul_(2).round_().div_(2)  # steps of 1/2: ties everywhere
    logits[0] = 1.0  # all tied: top-p 0.5 keeps exactly the first half, in token order
    logits[3] = 1.0  # top-p 0.75 keeps the first 2,250: its ties run on past the kernel's first chunk of 2,048
    logits[1, 100:] = float("-inf")
    top_p = torch.rand(rows) * 0.8 + 0.1
    top_p[0], top_p[2], top_p[3] = 0.5, 1.0, 0.75
    min_p = torch.rand(rows) * 0.3
    top_k = torch.randint(600, VOCAB, (rows,))
    expand = lambda t: t.repeat_interleave(DRAWS_PER_ROW, 0)  # noqa: E731
    logits = expand(logits)
    batch = logits.shape[0]
    draws = RandomDraws(temperature=torch.ones(batch), top_k=expand(top_k) if "top_k" in filters else None,
                        top_p=expand(top_p) if "top_p" in filters else None,
                        min_p=expand(min_p) if "min_p" in filters else None,
                        seeds=torch.zeros(batch, 2, dtype=torch.int64),
                        output_positions=torch.zeros(batch, dtype=torch.int64), filter_width=VOCAB)
    uniform = torch.rand(batch, dtype=torch.float64)
    uniform[DRAWS_PER_ROW - 1] = uniform[4 * DRAWS_PER_ROW - 1] = 1 - 2**-53  # rows 0 and 3: their last kept token
    expected = drawn_tokens(*kept_tokens(logits, draws.top_k, draws.top_p, draws.min_p, VOCAB), uniform)
    if "top_p" in filters:
        assert expected[DRAWS_PER_ROW - 1] == VOCAB // 2 - 1
        assert expected[4 * DRAWS_PER_ROW - 1] == VOCAB * 3 // 4 - 1
    on_device = RandomDraws(*(t.to(device) if isinstance(t, torch.Tensor) else t for t in (
        draws.temperature, draws.top_k, draws.top_p, draws.min_p, draws.seeds, draws.output_positions,
        draws.filter_width)))
    drawn = _drawn_over_the_vocabulary_on_gpu(logits.to(device), on_device, uniform.to(device))
    assert torch.equal(drawn.cpu(), expected)
    assert len(set(expected.tolist())) > batch // 4
