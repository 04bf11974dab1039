from sluice.core.logprobs import Logprobs
from sluice.v1 import generation_pb2 as pb


def logprobs_to_pb(logprobs: Logprobs) -> pb.Logprobs:
    return pb.Logprobs(token_ids=logprobs.token_ids, logprobs=logprobs.logprobs, ranks=logprobs.ranks,
                       num_top=logprobs.num_top, top_token_ids=logprobs.top_token_ids,
                       top_logprobs=logprobs.top_logprobs)


def logprobs_from_pb(message: pb.Logprobs) -> Logprobs:
    return Logprobs(message.num_top, list(message.token_ids), list(message.logprobs), list(message.ranks),
                    list(message.top_token_ids), list(message.top_logprobs))
