"""Whether a request stops after its newest token: EOS or a stop token id, max_tokens, the model's length."""
from sluice.core.finish_reason import FinishReason
from sluice.scheduler.request import Request


def check_stop(request: Request, eos_token_ids: frozenset[int], max_model_len: int) -> FinishReason | None:
    """Why the request stops after its newest output token, if it does. EOS and stop token ids count only once
    min_tokens are out; the stopping token stays in the output."""
    params = request.sampling_params
    num_output = len(request.output_token_ids)
    if num_output >= params.min_tokens:
        token = request.output_token_ids[-1]
        if (token in eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            return FinishReason.STOP
    if num_output >= params.max_tokens or len(request.all_token_ids) >= max_model_len:
        return FinishReason.LENGTH
    return None
