"""Log probabilities of given tokens under raw logits, with their ranks and the most likely alternatives."""
import torch

from sluice.core.logprobs import Logprobs


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor,
                   groups: list[tuple[str, int, int]]) -> dict[str, Logprobs]:
    """logits: [rows, vocab] raw; token_ids: [rows]. Each group (request id, number of rows, num_top) owns the next
    rows in order. Reductions over the logits as they are (a logprob is the logit less the row's logsumexp), so no
    second [rows, vocab] tensor is made; one topk for all rows; the lists are cut per group at the end."""
    normaliser = logits.logsumexp(dim=-1, keepdim=True)
    chosen_logits = logits.gather(1, token_ids.unsqueeze(1))
    ranks = (logits > chosen_logits).sum(dim=1) + 1
    top_logits, top_ids = logits.topk(max(num_top for _, _, num_top in groups), dim=-1)
    chosen, top_logprobs = chosen_logits - normaliser, top_logits - normaliser
    token_list, chosen_list, rank_list = token_ids.tolist(), chosen.squeeze(1).tolist(), ranks.tolist()
    top_id_list, top_logprob_list = top_ids.tolist(), top_logprobs.tolist()
    out, start = {}, 0
    for request_id, num_rows, num_top in groups:
        end = start + num_rows
        out[request_id] = Logprobs(
            num_top, token_list[start:end], chosen_list[start:end], rank_list[start:end],
            [t for row in top_id_list[start:end] for t in row[:num_top]],
            [v for row in top_logprob_list[start:end] for v in row[:num_top]])
        start = end
    return out
