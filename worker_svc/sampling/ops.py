"""Batched sampling: every transform is one tensor op over the whole batch, never a Python loop per request.

Order, as in Hugging Face transformers and vLLM: penalties, logit bias, token masks (min_tokens, bad words,
allowed_token_ids, structured output) on the raw logits; greedy rows take the argmax there. Sampled rows then apply
temperature, top-k, top-p and min-p (each on what the previous one left) and draw by inverting the distribution's CDF
at a seeded uniform number.
"""
from dataclasses import dataclass

import torch

from worker_svc.sampling.seeded_random import seeded_uniform


@dataclass(slots=True)
class RandomDraws:
    """What a batch with rows that draw at random needs, one row per request (greedy rows included)."""

    temperature: torch.Tensor  # [batch] float32, 0 where greedy
    top_k: torch.Tensor  # [batch] int64, vocab size where disabled
    top_p: torch.Tensor  # [batch] float32
    min_p: torch.Tensor  # [batch] float32
    seeds: torch.Tensor  # [batch, 2] int64: the low and high 32 bits of each request's seed
    output_positions: torch.Tensor  # [batch] int64: the index of the token being sampled in the request's output
    needs_filter: bool  # some row uses top-k, top-p or min-p


@dataclass(slots=True)
class SamplingTensors:
    """One row per request that samples this step."""

    draws: RandomDraws | None = None  # None: every row is greedy
    penalties: "Penalties | None" = None
    sparse: "SparseLogits | None" = None  # logit bias; -inf on EOS and stop ids while short of min_tokens, and on
    # a bad word's last token after its others
    allowed: torch.Tensor | None = None  # [batch, vocab] bool (allowed_token_ids, structured output)


@dataclass(slots=True)
class Penalties:
    presence: torch.Tensor  # [batch] float32
    frequency: torch.Tensor  # [batch] float32
    repetition: torch.Tensor  # [batch] float32, 1 where off
    output_counts: torch.Tensor  # [batch, vocab] int32: how often each token was generated
    prompt_mask: torch.Tensor  # [batch, vocab] bool: the token occurs in the prompt


@dataclass(slots=True)
class SparseLogits:
    """Values added to a few logits per row; padding entries point one past the vocabulary."""

    token_ids: torch.Tensor  # [batch, width] int64
    values: torch.Tensor  # [batch, width] float32


def sample(logits: torch.Tensor, tensors: SamplingTensors) -> torch.Tensor:
    # logits: [batch, vocab] float32, modified in place -> sampled token ids [batch]
    logits = process_logits(logits, tensors)
    greedy_tokens = logits.argmax(dim=-1)
    draws = tensors.draws
    if draws is None:
        return greedy_tokens
    is_greedy = draws.temperature == 0
    logits = logits / torch.where(is_greedy, 1.0, draws.temperature).unsqueeze(1)
    if draws.needs_filter:
        logits = filter_top_k_top_p_min_p(logits, draws.top_k, draws.top_p, draws.min_p)
    sampled = draw(logits.softmax(dim=-1), seeded_uniform(draws.seeds, draws.output_positions))
    return torch.where(is_greedy, greedy_tokens, sampled)


def draw(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The first token whose cumulative probability exceeds `uniform` (a token of probability 0 is never drawn)."""
    cdf = probs.double().cumsum(dim=-1)
    target = (uniform * cdf[:, -1]).unsqueeze(1)
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)


def process_logits(logits: torch.Tensor, tensors: SamplingTensors) -> torch.Tensor:
    if tensors.penalties is not None:
        logits = apply_penalties(logits, tensors.penalties)
    if tensors.sparse is not None:
        added = logits.new_zeros(logits.shape[0], logits.shape[1] + 1)
        added.scatter_add_(1, tensors.sparse.token_ids, tensors.sparse.values)
        logits += added[:, :-1]
    if tensors.allowed is not None:
        logits.masked_fill_(~tensors.allowed, float("-inf"))
    return logits


def apply_penalties(logits: torch.Tensor, penalties: Penalties) -> torch.Tensor:
    """Repetition penalty over prompt and output tokens (divides positive logits, multiplies negative ones), then
    OpenAI's presence and frequency penalties over output tokens."""
    counts = penalties.output_counts
    generated = counts > 0
    repetition = penalties.repetition.unsqueeze(1)
    penalised = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(generated | penalties.prompt_mask, penalised, logits)
    logits -= penalties.frequency.unsqueeze(1) * counts + penalties.presence.unsqueeze(1) * generated
    return logits


def filter_top_k_top_p_min_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                             min_p: torch.Tensor) -> torch.Tensor:
    """Sets to -inf what top-k, then top-p over the tokens top-k kept, then min-p would remove (the most likely token
    always stays: top_p > 0, min_p <= 1)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)
    sorted_logits = sorted_logits.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop = (mass_before >= top_p.unsqueeze(1)) | (sorted_probs < min_p.unsqueeze(1) * sorted_probs[:, :1])
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
