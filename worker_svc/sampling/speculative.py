"""Verifying proposed tokens (speculative decoding) in one batched pass over every row of the step.

A request with k proposals has k + 1 rows: row j holds the target's logits after the request's newest token and its
first j proposals, and row j's proposal is proposal j + 1 (none on the last row). A proposal is a point mass, so the
standard rule (accept with min(1, p/q), else draw from the residual (p - q)+) becomes: accept x with probability
p(x), where p is the row's processed distribution (after penalties, masks, temperature, top-k, top-p, min-p); else
draw from p without x, renormalised. Greedy rows accept x while it is the argmax and otherwise emit the argmax.

One seeded uniform u per row (by seed and output position) decides both: x is accepted when u < p(x), and otherwise
(u - p(x)) / (1 - p(x)), uniform again, draws from the rest. A row without a proposal draws exactly as ops.sample does.
"""
from dataclasses import dataclass

import torch

from worker_svc.sampling.ops import (SamplingTensors, draw, fixed_point, kept_tokens, process_logits,
                                    unnormalised_probs)
from worker_svc.sampling.seeded_random import seeded_uniform
from worker_svc.sampling.upload import upload

NO_PROPOSAL = -1


def verify(logits: torch.Tensor, tensors: SamplingTensors,
           proposals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [rows, vocab] raw, left as they are; tensors: one row each; proposals: [rows] int64, NO_PROPOSAL
    where none. Returns each row's token (the proposal where accepted) and whether its proposal was accepted."""
    logits = process_logits(logits, tensors)
    has_proposal = proposals != NO_PROPOSAL
    proposed = proposals.clamp(min=0)
    greedy_tokens = logits.argmax(dim=-1)
    greedy_accepted = has_proposal & (greedy_tokens == proposed)
    greedy_tokens = torch.where(greedy_accepted, proposed, greedy_tokens)
    draws = tensors.draws
    if draws is None:
        return greedy_tokens, greedy_accepted
    is_greedy = draws.temperature == 0
    logits = logits / torch.where(is_greedy, 1.0, draws.temperature).unsqueeze(1)
    uniform = seeded_uniform(draws.seeds, draws.output_positions)
    if draws.filter_width is None:
        weights = fixed_point(unnormalised_probs(logits))
        token_ids = None
        is_proposal = torch.zeros_like(weights, dtype=torch.bool).scatter_(1, proposed.unsqueeze(1), True)
    else:
        token_ids, weights = kept_tokens(logits, draws.top_k, draws.top_p, draws.min_p, draws.filter_width)
        is_proposal = token_ids == proposed.unsqueeze(1)
    is_proposal &= has_proposal.unsqueeze(1)
    total = weights.sum(dim=-1, dtype=torch.float64)
    proposal_weight = weights.masked_fill(~is_proposal, 0).sum(dim=-1, dtype=torch.float64)
    accepted = uniform * total < proposal_weight
    rest_uniform = torch.where(has_proposal, (uniform * total - proposal_weight)
                               / (total - proposal_weight).clamp(min=torch.finfo(torch.float64).tiny), uniform)
    drawn = draw(weights.masked_fill(is_proposal, 0), rest_uniform.clamp(max=1.0))
    if token_ids is not None:
        drawn = token_ids.gather(1, drawn.unsqueeze(1)).squeeze(1)
    sampled_tokens = torch.where(accepted, proposed, drawn)
    return (torch.where(is_greedy, greedy_tokens, sampled_tokens),
            torch.where(is_greedy, greedy_accepted, accepted))


def leading_accepted(accepted: torch.Tensor, row_request: torch.Tensor, first_rows: torch.Tensor) -> torch.Tensor:
    """[requests]: how many of each request's leading rows accepted their proposal. accepted: [rows] (False on each
    request's last row); row_request: [rows] the request of each row; first_rows: [requests] each one's first row."""
    rows = torch.arange(accepted.shape[0], device=accepted.device)
    first_rejected = torch.full_like(first_rows, accepted.shape[0]).scatter_reduce_(
        0, row_request, torch.where(accepted, accepted.shape[0], rows), "amin")
    return first_rejected - first_rows


@dataclass(slots=True)
class ProposalRows:
    """The rows of a step whose requests carry proposals: k + 1 per request with k proposals, 1 per other request."""

    row_request_ids: list[str]  # the request of each row
    first_rows: list[int]  # each request's first row
    row_request: torch.Tensor  # [rows] int64: the request (its index in the batch) of each row
    offsets: torch.Tensor  # [rows] int64: j on a request's row j (its output position past the request's newest)
    proposals: torch.Tensor  # [rows] int64: the proposal each row's logits verify, NO_PROPOSAL on a request's last
    first_rows_t: torch.Tensor  # [requests] int64

    @classmethod
    def of(cls, request_ids: list[str], spec_token_ids: dict[str, list[int]], device: torch.device) -> "ProposalRows":
        row_request_ids, first_rows, row_request, offsets, proposals = [], [], [], [], []
        for i, request_id in enumerate(request_ids):
            proposed = spec_token_ids.get(request_id, [])
            first_rows.append(len(row_request_ids))
            row_request_ids += [request_id] * (len(proposed) + 1)
            row_request += [i] * (len(proposed) + 1)
            offsets += range(len(proposed) + 1)
            proposals += [*proposed, NO_PROPOSAL]
        num_rows = len(row_request)
        row_request_t, offsets_t, proposals_t, first_rows_t = upload(
            row_request + offsets + proposals + first_rows, torch.int64, device).split_with_sizes(
            [num_rows, num_rows, num_rows, len(first_rows)])
        return cls(row_request_ids, first_rows, row_request_t, offsets_t, proposals_t, first_rows_t)


def verify_rows(logits: torch.Tensor, tensors: SamplingTensors,
                rows: ProposalRows) -> tuple[torch.Tensor, torch.Tensor]:
    """Per request: the token sampled after its accepted proposals, and how many it accepted."""
    if tensors.draws is not None:
        tensors.draws.output_positions = tensors.draws.output_positions + rows.offsets
    row_tokens, accepted = verify(logits, tensors, rows.proposals)
    num_accepted = leading_accepted(accepted, rows.row_request, rows.first_rows_t)
    return row_tokens[rows.first_rows_t + num_accepted], num_accepted
