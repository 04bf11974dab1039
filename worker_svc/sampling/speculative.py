"""Verifying proposed tokens (speculative decoding) in one batched pass over every row of the step.

A request with k proposals has k + 1 rows: row j holds the target's logits after the request's newest token and its
first j proposals, and row j's proposal is proposal j + 1 (none on the last row). The standard rule applies to each
proposal x, drawn from the proposer's distribution q: accept x with probability min(1, p(x) / q(x)), where p is the
row's processed distribution (after penalties, masks, temperature, top-k, top-p, min-p), else draw from the residual
(p - q)+, renormalised; the token is then distributed as p whatever q is. An ngram proposal is a point mass (q(x) = 1),
so it is accepted with probability p(x) and the residual is p without x; a draft model's q is the distribution it drew
x from. Greedy rows accept x while it is the argmax and otherwise emit the argmax.

One seeded uniform u per row (by seed and output position) decides both: x is accepted when u < p(x) / q(x), and
otherwise (u - a) / (1 - a), with a = p(x) / q(x), is uniform again and draws from the residual. A row without a
proposal draws exactly as ops.sample does.
"""
from dataclasses import dataclass

import torch

from sluice.worker.sampling.ops import SamplingTensors, drawn_tokens, process_logits, row_maxima, sampling_weights
from sluice.worker.sampling.seeded_random import seeded_uniform
from sluice.worker.sampling.upload import upload

NO_PROPOSAL = -1


def verify(logits: torch.Tensor, tensors: SamplingTensors, proposals: torch.Tensor,
           draft_probs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [rows, vocab] raw, left as they are; tensors: one row each; proposals: [rows] int64, NO_PROPOSAL
    where none; draft_probs: [rows, vocab], the distribution each row's proposal was drawn from (None: point masses).
    Returns each row's token (the proposal where accepted) and whether its proposal was accepted."""
    logits = process_logits(logits, tensors)
    has_proposal = proposals != NO_PROPOSAL
    proposed = proposals.clamp(min=0)
    greedy_tokens = row_maxima(logits)[1]
    greedy_accepted = has_proposal & (greedy_tokens == proposed)
    greedy_tokens = torch.where(greedy_accepted, proposed, greedy_tokens)
    draws = tensors.draws
    if draws is None:
        return greedy_tokens, greedy_accepted
    uniform = seeded_uniform(draws.seeds, draws.output_positions)
    token_ids, weights = sampling_weights(logits, draws)
    if token_ids is None:
        is_proposal = torch.zeros_like(weights, dtype=torch.bool).scatter_(1, proposed.unsqueeze(1), True)
    else:
        is_proposal = token_ids == proposed.unsqueeze(1)
    is_proposal &= has_proposal.unsqueeze(1)
    total = weights.sum(dim=-1, keepdim=True)
    proposal_weight = weights.masked_fill(~is_proposal, 0).sum(dim=-1, dtype=torch.float64)  # p(x), times total
    if draft_probs is None:
        draft_weights = torch.where(is_proposal, total, 0)
        proposal_draft_weight = total.squeeze(1).double()
    else:
        kept_probs = draft_probs if token_ids is None else draft_probs.gather(1, token_ids)
        draft_weights = (kept_probs.double() * total).long() * has_proposal.unsqueeze(1)
        proposal_draft_weight = draft_probs.gather(1, proposed.unsqueeze(1)).squeeze(1).double() * total.squeeze(1)
    accepted = uniform * proposal_draft_weight < proposal_weight
    rest_uniform = torch.where(has_proposal, (uniform * proposal_draft_weight - proposal_weight)
                               / (proposal_draft_weight - proposal_weight).clamp(min=torch.finfo(torch.float64).tiny),
                               uniform)
    residual = (weights - draft_weights).clamp_(min=0)
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, weights)  # p = q up to rounding
    drawn = drawn_tokens(token_ids, residual, rest_uniform.clamp(max=1.0))
    sampled_tokens = torch.where(accepted, proposed, drawn)
    is_greedy = draws.temperature == 0
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
class Drafts:
    """A draft model's proposals for a step, on the device: row i holds request_ids[i]'s, its first counts[i] valid."""

    request_ids: list[str]
    counts: list[int]
    token_ids: torch.Tensor  # [requests, max(counts)] int64
    probs: torch.Tensor | None  # [requests, max(counts), vocab] float32: q of each proposal; None when all are greedy

    def flat_indices(self) -> list[int]:
        """Where each valid proposal is in token_ids.flatten(), request by request."""
        width = self.token_ids.shape[1]
        return [i * width + j for i, count in enumerate(self.counts) for j in range(count)]

    def on_host(self, token_ids: list[int]) -> dict[str, list[int]]:
        """Each request's proposals, from `token_ids` (the flattened token_ids, copied to the host)."""
        width = self.token_ids.shape[1]
        return {request_id: token_ids[i * width:i * width + count]
                for i, (request_id, count) in enumerate(zip(self.request_ids, self.counts))}


@dataclass(slots=True)
class ProposalRows:
    """The rows of a step whose requests carry proposals: k + 1 per request with k proposals, 1 per other request."""

    row_request_ids: list[str]  # the request of each row
    first_rows: list[int]  # each request's first row
    row_request: torch.Tensor  # [rows] int64: the request (its index in the batch) of each row
    offsets: torch.Tensor  # [rows] int64: j on a request's row j (its output position past the request's newest)
    proposals: torch.Tensor  # [rows] int64: the proposal each row's logits verify, NO_PROPOSAL on a request's last
    first_rows_t: torch.Tensor  # [requests] int64
    draft_probs: torch.Tensor | None = None  # [rows, vocab]: the distribution of each row's proposal (None: points)

    @property
    def max_proposals(self) -> int:
        ends = [*self.first_rows[1:], len(self.row_request_ids)]
        return max(end - first for first, end in zip(self.first_rows, ends)) - 1

    @classmethod
    def of(cls, request_ids: list[str], spec_token_ids: dict[str, list[int]], device: torch.device) -> "ProposalRows":
        """The rows of ngram proposals, known on the host."""
        row_request_ids, first_rows, row_request, offsets = _layout(
            request_ids, {request_id: len(tokens) for request_id, tokens in spec_token_ids.items()})
        proposals = [token for request_id in request_ids for token in (*spec_token_ids.get(request_id, ()),
                                                                       NO_PROPOSAL)]
        num_rows = len(row_request)
        row_request_t, offsets_t, proposals_t, first_rows_t = upload(
            row_request + offsets + proposals + first_rows, torch.int64, device).split_with_sizes(
            [num_rows, num_rows, num_rows, len(first_rows)])
        return cls(row_request_ids, first_rows, row_request_t, offsets_t, proposals_t, first_rows_t)

    @classmethod
    def of_drafts(cls, request_ids: list[str], drafts: Drafts, device: torch.device) -> "ProposalRows":
        """The rows of a draft model's proposals, placed from the device without a round trip to the host."""
        counts = dict(zip(drafts.request_ids, drafts.counts))
        row_request_ids, first_rows, row_request, offsets = _layout(request_ids, counts)
        first_row = dict(zip(request_ids, first_rows))
        draft_rows = [first_row[request_id] + j for request_id, count in zip(drafts.request_ids, drafts.counts)
                      for j in range(count)]
        sources = drafts.flat_indices()
        num_rows, num_drafts = len(row_request), len(draft_rows)
        row_request_t, offsets_t, first_rows_t, draft_rows_t, sources_t = upload(
            row_request + offsets + first_rows + draft_rows + sources, torch.int64, device).split_with_sizes(
            [num_rows, num_rows, len(first_rows), num_drafts, num_drafts])
        proposals_t = torch.full((num_rows,), NO_PROPOSAL, dtype=torch.int64, device=device).index_copy_(
            0, draft_rows_t, drafts.token_ids.flatten().index_select(0, sources_t))
        probs = None
        if drafts.probs is not None:
            flat_probs = drafts.probs.flatten(0, 1)
            probs = flat_probs.new_zeros(num_rows, flat_probs.shape[1]).index_copy_(
                0, draft_rows_t, flat_probs.index_select(0, sources_t))
        return cls(row_request_ids, first_rows, row_request_t, offsets_t, proposals_t, first_rows_t, probs)


def preceding_proposals(rows: ProposalRows) -> torch.Tensor:
    """[rows, the most proposals of a request]: a request's row j holds its first j proposals, then NO_PROPOSAL."""
    columns = torch.arange(rows.max_proposals, device=rows.proposals.device)
    sources = (torch.arange(rows.proposals.shape[0], device=columns.device) - rows.offsets).unsqueeze(1) + columns
    before = columns < rows.offsets.unsqueeze(1)
    return torch.where(before, rows.proposals[sources.clamp(max=rows.proposals.shape[0] - 1)], NO_PROPOSAL)


def _layout(request_ids: list[str], counts: dict[str, int]) -> tuple[list[str], list[int], list[int], list[int]]:
    """(the request id of each row, each request's first row, the request index of each row, each row's offset)."""
    row_request_ids, first_rows, row_request, offsets = [], [], [], []
    for i, request_id in enumerate(request_ids):
        num_rows = counts.get(request_id, 0) + 1
        first_rows.append(len(row_request_ids))
        row_request_ids += [request_id] * num_rows
        row_request += [i] * num_rows
        offsets += range(num_rows)
    return row_request_ids, first_rows, row_request, offsets


def verify_rows(logits: torch.Tensor, tensors: SamplingTensors,
                rows: ProposalRows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per request: the token sampled after its accepted proposals, and how many it accepted; and each row's token
    (its proposal where accepted). tensors: one row per row, their penalties counting the proposals before it."""
    if tensors.draws is not None:
        tensors.draws.output_positions = tensors.draws.output_positions + rows.offsets
    row_tokens, accepted = verify(logits, tensors, rows.proposals, rows.draft_probs)
    num_accepted = leading_accepted(accepted, rows.row_request, rows.first_rows_t)
    return row_tokens[rows.first_rows_t + num_accepted], num_accepted, row_tokens
