"""Hugging Face transformers on the same prompts and weights, in the same process run, for side-by-side ratios."""
import statistics
import time

import torch

from sluice.cli.bench.workload import BenchRequest


def load_hf_model(model: str, load_format: str, dtype: torch.dtype, device: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    if load_format != "dummy":
        return AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()
    from sluice.worker.loading.dummy_weights import dummy_checkpoint

    hf_config, state = dummy_checkpoint(model, dtype, torch.device(device))
    with torch.device(device):
        hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**hf_config), dtype=dtype).eval()
    hf.load_state_dict(state, strict=False)
    if hf_config.get("tie_word_embeddings"):
        hf.tie_weights()
    return hf


def output_len(requests: list[BenchRequest]) -> int:
    """HF generates one length for a whole batch: the workload's mean output length."""
    return round(statistics.fmean(r.max_tokens for r in requests))


@torch.inference_mode()
def static_generate(model, requests: list[BenchRequest], batch_size: int) -> dict:
    """Static batches through `generate`, prompts left-padded; counts every generated token of every row."""
    new_tokens = output_len(requests)
    device = next(model.parameters()).device
    started = time.perf_counter()
    generated = 0
    for start in range(0, len(requests), batch_size):
        batch = [r.prompt_token_ids for r in requests[start:start + batch_size]]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=0)
        generated += (out.shape[1] - width) * len(batch)
    return _summary("hf generate (static batches)", generated, requests, time.perf_counter() - started)


@torch.inference_mode()
def batch_one_generate(model, requests: list[BenchRequest]) -> dict:
    """`generate` of one request at a time: the median time per output token after the first (a whole generation
    less one of a single token), as `sluice bench latency --in-process` times Sluice."""
    device = next(model.parameters()).device
    per_token = []
    for request in [requests[0], *requests]:  # the first generation warms up
        ids = torch.tensor([request.prompt_token_ids], device=device)
        times = []
        for new_tokens in (1, request.max_tokens):
            started = time.perf_counter()
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - started)
        per_token.append((times[1] - times[0]) / (request.max_tokens - 1) * 1000)
    return {"name": "hf generate (batch 1)", "ms_per_token": statistics.median(per_token[1:])}


def continuous_generate(model, requests: list[BenchRequest]) -> dict:
    """transformers' own continuous batching, `generate_batch` (not under inference mode: its generation thread
    updates tensors in place that it creates in the calling thread)."""
    from transformers import GenerationConfig

    new_tokens = output_len(requests)
    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                              eos_token_id=-1, pad_token_id=0)
    started = time.perf_counter()
    outputs = model.generate_batch(inputs=[r.prompt_token_ids for r in requests], generation_config=config)
    generated = sum(len(o.generated_tokens) for o in outputs.values())
    if not generated:
        raise RuntimeError("transformers' generate_batch generated no tokens; its log above says why")
    return _summary("hf generate_batch (continuous)", generated, requests, time.perf_counter() - started)


def _summary(name: str, generated: int, requests: list[BenchRequest], duration: float) -> dict:
    prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
    return {"name": name, "requests": len(requests), "duration_s": duration, "output_tokens": generated,
            "output_tokens_per_s": generated / duration, "total_tokens_per_s": (generated + prompt_tokens) / duration,
            "requests_per_s": len(requests) / duration}
