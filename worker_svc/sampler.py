"""Batched sampling: every transform is one tensor op over the whole batch, never a Python loop per request."""
from dataclasses import dataclass

import torch

from sluice.sampling_params import SamplingParams


@dataclass(slots=True)
class SamplingTensors:
    temperature: torch.Tensor  # [batch] float32, 0 where greedy
    top_k: torch.Tensor  # [batch] int64, vocab size where disabled
    top_p: torch.Tensor  # [batch] float32
    min_p: torch.Tensor  # [batch] float32
    all_greedy: bool

    @classmethod
    def build(cls, params: list[SamplingParams], vocab_size: int, device: torch.device) -> "SamplingTensors":
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k if p.top_k > 0 else vocab_size for p in params], device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            min_p=torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device),
            all_greedy=all(p.greedy for p in params),
        )


def sample(logits: torch.Tensor, tensors: SamplingTensors, generator: torch.Generator | None = None) -> torch.Tensor:
    # logits: [batch, vocab] float32 -> sampled token ids [batch]
    greedy_tokens = logits.argmax(dim=-1)
    if tensors.all_greedy:
        return greedy_tokens
    is_greedy = tensors.temperature == 0
    logits = logits / torch.where(is_greedy, 1.0, tensors.temperature).unsqueeze(1)
    probs = _filter(logits, tensors).softmax(dim=-1)
    # -- sample by the exponential race: argmax(p / E) with E ~ Exp(1) draws from p
    noise = torch.empty_like(probs).exponential_(generator=generator)
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(is_greedy, greedy_tokens, sampled)


def _filter(logits: torch.Tensor, tensors: SamplingTensors) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop = (ranks >= tensors.top_k.unsqueeze(1)) | (mass_before >= tensors.top_p.unsqueeze(1))
    drop |= sorted_probs < tensors.min_p.unsqueeze(1) * sorted_probs[:, :1]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
