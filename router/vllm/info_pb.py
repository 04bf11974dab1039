"""What the router knows of its model and its schedulers, in vLLM's engine protocol."""
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm

from sluice.v1 import generation_pb2, scheduler_pb2


def model_info_to_vllm_pb(info: generation_pb2.ModelInfo, tokenizer, tokenizer_path: str,
                          takes_images: bool) -> vllm.GetModelInfoResponse:
    return vllm.GetModelInfoResponse(
        model_path=tokenizer_path or info.model, is_generation=True, max_context_length=info.max_model_len,
        supports_vision=takes_images,
        vocab_size=info.vocab_size, served_model_name=info.model, tokenizer_path=tokenizer_path,
        architectures=[info.architecture], eos_token_ids=info.eos_token_ids,
        bos_token_id=tokenizer.bos_token_id or 0, pad_token_id=tokenizer.pad_token_id or 0,
        max_req_input_len=info.max_model_len - 1)


def loads_to_vllm_pb(loads: list[scheduler_pb2.Load], block_size: int) -> vllm.GetLoadsResponse:
    """The replicas behind this router as one engine (one data-parallel rank)."""
    used = sum(load.num_used_blocks for load in loads)
    total = sum(load.num_total_blocks for load in loads)
    num_running = sum(load.num_running for load in loads)
    num_waiting = sum(load.num_waiting for load in loads)
    hit_rates = [load.prefix_cache_hit_rate for load in loads]
    load = vllm.SchedulerLoad(
        dp_rank=0, num_running_reqs=num_running, num_waiting_reqs=num_waiting,
        num_total_reqs=num_running + num_waiting, num_used_tokens=used * block_size,
        max_total_num_tokens=total * block_size, token_usage=used / total if total else 0.0,
        cache_hit_rate=sum(hit_rates) / len(hit_rates) if hit_rates else 0.0)
    return vllm.GetLoadsResponse(dp_rank_count=1, loads=[load])


def engine_load_to_vllm_pb(load: scheduler_pb2.Load, block_size: int, sample: int,
                           load_only: bool) -> common_pb2.EngineLoad:
    """The load record of a KV event batch: the numbers GetLoads answers with, and the engine's silence and prefill
    in hand, which a gateway judges a wedged engine by. The scheduler sees every step, so its silence is one step's
    at most while the worker serves; its used blocks leave out the cached ones no request holds, so the usage is the
    active one too. The telemetry beyond routing rides the stream's first record and its load-only batches."""
    polled = loads_to_vllm_pb([load], block_size).loads[0]
    record = common_pb2.EngineLoad(
        running_requests=polled.num_running_reqs, waiting_requests=polled.num_waiting_reqs,
        token_usage=polled.token_usage, active_token_usage=polled.token_usage,
        gen_throughput=polled.gen_throughput, max_running_requests=polled.max_running_requests, sample=sample,
        load_only=load_only, engine_reports_steps=True, prefill_pending_tokens=load.num_prefill_pending_tokens)
    if load.HasField("engine_silence_ms"):
        record.engine_silence_ms = load.engine_silence_ms
    if load_only or sample == 1:
        record.cache_hit_rate = polled.cache_hit_rate
        record.num_used_tokens = polled.num_used_tokens
        record.max_total_num_tokens = polled.max_total_num_tokens
    return record
