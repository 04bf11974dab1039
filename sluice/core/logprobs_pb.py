"""Logprobs and LogprobRows to and from sluice.v1's messages."""
from sluice.core.logprobs import LogprobRows, Logprobs
from sluice.v1 import generation_pb2 as pb


def logprobs_to_pb(logprobs: Logprobs) -> pb.Logprobs:
    return pb.Logprobs(token_ids=logprobs.token_ids, logprobs=logprobs.logprobs, ranks=logprobs.ranks,
                       num_top=logprobs.num_top, top_token_ids=logprobs.top_token_ids,
                       top_logprobs=logprobs.top_logprobs)


def logprob_rows_to_pb(rows: LogprobRows, sample_indices: list[int] = ()) -> pb.LogprobRows | None:
    """None for no rows: a message field left unset costs nothing to write or read."""
    if not rows.request_ids:
        return None
    return pb.LogprobRows(request_ids=rows.request_ids, sample_indices=sample_indices, num_rows=rows.num_rows,
                          num_tops=rows.num_tops, token_ids=rows.token_ids, logprobs=rows.logprobs, ranks=rows.ranks,
                          top_token_ids=rows.top_token_ids, top_logprobs=rows.top_logprobs)


def logprob_rows_from_pb(message: pb.LogprobRows) -> LogprobRows:
    if not message.request_ids:
        return LogprobRows()
    return LogprobRows(list(message.request_ids), list(message.num_rows), list(message.num_tops),
                       list(message.token_ids), list(message.logprobs), list(message.ranks),
                       list(message.top_token_ids), list(message.top_logprobs))
