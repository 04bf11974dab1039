"""Checks a request must pass before it may wait: valid for this model, able to fit the pool, room in the queue."""
from sluice.core.errors import InvalidArgument, ResourceExhausted
from sluice.scheduler.config import SchedulerConfig
from sluice.scheduler.request import Request
from sluice.scheduler.request_queue import WaitingQueue


def validate_request(request: Request, config: SchedulerConfig) -> None:
    params = request.sampling_params
    if not request.prompt_token_ids:
        raise InvalidArgument("prompt_token_ids", "the prompt is empty")
    if params.max_tokens < 1:
        raise InvalidArgument("max_tokens", f"must be >= 1, got {params.max_tokens}")
    if params.min_tokens < 0:
        raise InvalidArgument("min_tokens", f"must be >= 0, got {params.min_tokens}")
    if params.n < 1:
        raise InvalidArgument("n", f"must be >= 1, got {params.n}")
    num_prompt = request.num_prompt_tokens
    if num_prompt + params.max_tokens > config.max_model_len:
        raise InvalidArgument("max_tokens", f"prompt ({num_prompt} tokens) + max_tokens ({params.max_tokens}) "
                                            f"exceeds max_model_len ({config.max_model_len})")
    pool_tokens = config.num_blocks * config.block_size
    if num_prompt > pool_tokens:
        raise InvalidArgument("prompt_token_ids", f"{num_prompt} tokens exceed the KV cache ({pool_tokens} tokens)")
    if num_prompt + params.max_tokens > pool_tokens:
        raise InvalidArgument("max_tokens", f"prompt ({num_prompt} tokens) + max_tokens ({params.max_tokens}) "
                                            f"exceeds the KV cache ({pool_tokens} tokens)")


def validate_kv_transfer(request: Request, config: SchedulerConfig) -> None:
    params = request.kv_transfer
    if params is None:
        return
    leg, role = ("do_remote_decode", "prefill") if params.do_remote_decode else ("do_remote_prefill", "decode")
    if params.do_remote_decode and params.do_remote_prefill:
        raise InvalidArgument("kv_transfer", "set one of do_remote_decode and do_remote_prefill")
    if config.kv_role != role:
        raise InvalidArgument(f"kv_transfer.{leg}", f"this replica's kv_role is {config.kv_role!r}, not {role!r}")
    if request.sampling_params.n != 1:
        raise InvalidArgument("n", "a disaggregated request has one sample")
    if params.do_remote_prefill and not (params.remote_host and params.remote_port and params.remote_request_id):
        raise InvalidArgument("kv_transfer.remote_host", "a decode leg names the prefill replica (remote_host, "
                                                         "remote_port) and its lease (remote_request_id)")


def check_queue_room(request: Request, waiting: WaitingQueue, config: SchedulerConfig) -> None:
    if len(waiting) >= config.max_waiting_requests:
        raise ResourceExhausted(f"{len(waiting)} requests are waiting (max_waiting_requests)")
    if waiting.num_tokens + request.num_tokens > config.max_waiting_tokens:
        raise ResourceExhausted(f"{waiting.num_tokens} tokens are waiting; {request.num_tokens} more would exceed "
                                f"max_waiting_tokens ({config.max_waiting_tokens})")
