"""A quantized model against the unquantized one on the same weights: greedy agreement on ten prompts, the
log-likelihood of a fixed text (`--text`, by default tests/worker/scored_passage.txt: 453 tokens of prose and code),
the cosine similarity and KL divergence of its logits, and each decoder layer's output (the residual stream after it)
over the text: its cosine similarity and relative error, printed as JSON.
--what weights compares --quantization fp8 with auto; kv-cache --kv-cache-dtype fp8 with auto; bfloat16 the model
in bfloat16 (weights and activations, as --dtype bfloat16 serves it) with --dtype; gptq, awq and
compressed-tensors write the model's checkpoint in 4 bits (round to nearest in groups of --group-size inputs: GPTQ
and compressed-tensors symmetric, AWQ with zero points) and load it as published, and also hold it to the same
checkpoint dequantized in float32 ("dequantized": the largest difference of the text's logits, and greedy agreement).
Run from the repository root: .venv/bin/python benchmarks/quantization_accuracy.py [--what ...] [--model DIR]
[--tokens 40] [--dtype float32]; with --load-format dummy (e.g. --model Qwen3-0.6B --dtype bfloat16 --device cuda)
the prompts and the text are random token ids (fp8 only)."""
import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from sluice.cli.model_store import default_model
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine

sys.path.append(str(Path(__file__).parents[1]))  # the tests/ helpers, behind the installed packages
from tests.e2e.test_greedy_matches_hf import PROMPTS
from tests.worker.stepping import prompt_logits, run_greedy
from tests.worker.test_fp8_accuracy import SCORED_PASSAGE, _log_likelihood
from tests.worker.w4a16_checkpoints import Variant, write_w4a16_checkpoint

W4A16_METHODS = ("gptq", "awq", "compressed-tensors")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--what", choices=["weights", "kv-cache", "bfloat16", *W4A16_METHODS], default="weights")
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--text", default=SCORED_PASSAGE)
    args = parser.parse_args()
    model = str(args.model or default_model())
    options = dict(dtype=args.dtype, device=args.device, load_format=args.load_format)
    exact = WorkerEngine.load(WorkerConfig(model=model, **options))
    prompts, ids = _token_ids(model, args.load_format, exact.model_config.vocab_size, Path(args.text).read_text())
    result = {}
    with tempfile.TemporaryDirectory() as folder:
        if args.what in W4A16_METHODS:
            quantized, dequantized = _four_bit_engines(model, args.what, args.group_size, Path(folder), options)
            result["dequantized"] = _agreement(dequantized, quantized, prompts, ids, args.tokens)
        elif args.what == "bfloat16":
            quantized = WorkerEngine.load(WorkerConfig(model=model, **(options | {"dtype": "bfloat16"})))
        else:
            option = "quantization" if args.what == "weights" else "kv_cache_dtype"
            quantized = WorkerEngine.load(WorkerConfig(model=model, **options, **{option: "fp8"}))
        print(json.dumps(_comparison(exact, quantized, prompts, ids, args.tokens) | result))


def _comparison(exact: WorkerEngine, quantized: WorkerEngine, prompts: list[list[int]], ids: list[int],
                tokens: int) -> dict:
    greedy = [run_greedy(engine, prompts, tokens, chunk=1000) for engine in (exact, quantized)]
    logits, streams = zip(*(_logits_and_layer_streams(engine, ids) for engine in (exact, quantized)))
    cosine = F.cosine_similarity(*logits, dim=-1)
    kl = F.kl_div(torch.log_softmax(logits[1], -1), torch.log_softmax(logits[0], -1), log_target=True,
                  reduction="none").sum(-1)
    likelihoods = [_log_likelihood(l, ids) for l in logits]
    return {
        "text_tokens": len(ids), "greedy_identical": sum(a == b for a, b in zip(*greedy)), "prompts": len(prompts),
        "tokens": tokens,
        "first_difference": [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(*greedy)],
        "log_likelihood": likelihoods, "log_likelihood_relative_change": likelihoods[1] / likelihoods[0] - 1,
        "logit_cosine_mean": cosine.mean().item(), "logit_cosine_min": cosine.min().item(),
        "kl_mean": kl.mean().item(), "kl_max": kl.max().item(),
        "layer_cosine_mean": [F.cosine_similarity(a, b, dim=-1).mean().item() for a, b in zip(*streams)],
        "layer_relative_error": [((b - a).norm() / a.norm()).item() for a, b in zip(*streams)]}


def _agreement(reference: WorkerEngine, engine: WorkerEngine, prompts: list[list[int]], ids: list[int],
               tokens: int) -> dict:
    greedy = [run_greedy(e, prompts, tokens, chunk=1000) for e in (reference, engine)]
    difference = (prompt_logits(engine, ids).float() - prompt_logits(reference, ids).float()).abs().max().item()
    return {"logit_max_abs_difference": difference, "greedy_identical": sum(a == b for a, b in zip(*greedy))}


def _four_bit_engines(model: str, method: str, group_size: int, folder: Path,
                      options: dict) -> tuple[WorkerEngine, WorkerEngine]:
    """The model written in 4 bits by `method`, and its dequantized float32 copy, loaded as the worker loads them."""
    from safetensors.torch import load_file

    hf_config = json.loads((Path(model) / "config.json").read_text())
    state = load_file(Path(model) / "model.safetensors")
    variant = Variant(method, group=group_size, sym=method != "awq")
    folders = write_w4a16_checkpoint(folder, variant, hf_config, state=state)
    return tuple(WorkerEngine.load(WorkerConfig(model=str(path), **options)) for path in folders)


def _logits_and_layer_streams(engine: WorkerEngine, ids: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The text's logits, and the residual stream after each decoder layer ([tokens, hidden] float32)."""
    streams = []
    hooks = [layer.register_forward_hook(lambda _, __, out: streams.append((out[0] + out[1]).float().cpu()))
             for layer in engine.model.layers]
    logits = prompt_logits(engine, ids).float().cpu()
    for hook in hooks:
        hook.remove()
    return logits, streams


def _token_ids(model: str, load_format: str, vocab_size: int, text: str) -> tuple[list[list[int]], list[int]]:
    """The ten prompts and the scored text: real ones through the model's tokenizer, random ids for dummy weights."""
    if load_format == "dummy":
        generator = torch.Generator().manual_seed(0)
        prompts = [torch.randint(vocab_size, (8 + 2 * i,), generator=generator).tolist() for i in range(10)]
        return prompts, torch.randint(vocab_size, (64,), generator=generator).tolist()
    tokenizer = AutoTokenizer.from_pretrained(model)
    return [tokenizer(p).input_ids for p in [*PROMPTS, "def quicksort(xs):"]], tokenizer(text).input_ids


if __name__ == "__main__":
    main()
