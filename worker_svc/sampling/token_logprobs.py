"""Log probabilities of given tokens under raw logits, with their ranks and the most likely alternatives."""
import torch

from sluice.core.logprobs import Logprobs


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor,
                   groups: list[tuple[str, int, int]]) -> dict[str, Logprobs]:
    """logits: [rows, vocab] raw; token_ids: [rows]. Each group (request id, number of rows, num_top) owns the next
    rows in order. One log_softmax and one topk for all rows; the lists are cut per group at the end."""
    logprobs = logits.log_softmax(dim=-1)
    chosen = logprobs.gather(1, token_ids.unsqueeze(1))
    ranks = (logprobs > chosen).sum(dim=1) + 1
    top_logprobs, top_ids = logprobs.topk(max(num_top for _, _, num_top in groups), dim=-1)
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
