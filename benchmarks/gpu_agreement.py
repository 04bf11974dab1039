"""Greedy agreement of the GPU worker with Hugging Face transformers on the same random weights (run on a CUDA machine).

For each shape, 8 random prompts and 32 greedy tokens from: HF in float32 (the reference), HF in bf16, Sluice in bf16
(the serving path: Triton kernels, CUDA graphs) and Sluice in float32. At every first divergence from the reference it
reports the reference's own float32 logit margin between the two tokens, next to the bf16 logit error that HF itself
makes at that position (|HF bf16 - HF fp32|, max over the vocabulary): a margin below that error is a tie in bf16.
Prints one summary per shape and writes JSON to the path given as the first argument.
"""
import json
import sys

import torch

from sluice.cli.offline import OfflineEngine
from sluice.core.sampling_params import SamplingParams
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.dummy_weights import dummy_checkpoint
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.weights import to_worker_layout
from sluice.worker.models.config import ModelConfig

NUM_PROMPTS, NEW_TOKENS = 8, 32
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU only for a dry run of this script


def _prompts(vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab_size, (int(n),), generator=generator).tolist()
            for n in torch.randint(8, 200, (NUM_PROMPTS,), generator=generator)]


def _hf_model(hf_config: dict, state: dict, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**hf_config), dtype=dtype).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [name for name in missing if name != "lm_head.weight"]:
        raise RuntimeError(f"HF checkpoint mismatch: missing {missing}, unexpected {unexpected}")
    if hf_config.get("tie_word_embeddings"):
        model.tie_weights()
    return model


@torch.inference_mode()
def _hf_runs(model, prompts: list[list[int]], forced: list[list[int]] | None):
    """(greedy continuations, logits of the positions that predict `forced` (or the greedy tokens) [32, vocab])."""
    greedy, logits = [], []
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt], device=DEVICE)
        out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
        greedy.append(out[0, len(prompt):].tolist())
        full = torch.tensor([prompt + (forced[i] if forced else greedy[-1])], device=DEVICE)
        logits.append(model(full).logits[0, len(prompt) - 1:len(prompt) - 1 + NEW_TOKENS].float())
    return greedy, logits


def _sluice_greedy(hf_config: dict, state: dict, dtype: str, prompts: list[list[int]]) -> list[list[int]]:
    config = ModelConfig.from_hf(hf_config)
    worker_config = WorkerConfig(model="dummy", load_format="dummy", dtype=dtype, device=DEVICE,
                                 gpu_memory_utilization=0.5)
    loaded = ModelLoader(worker_config).build(config, to_worker_layout(dict(state), config))
    worker = WorkerEngine(worker_config, loaded)
    engine = OfflineEngine(worker, max_model_len=1024, max_num_seqs=NUM_PROMPTS)
    greedy = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    tokens = [r.token_ids for r in engine.generate(prompts, [greedy] * NUM_PROMPTS)]
    del engine, worker
    torch.cuda.empty_cache()
    return tokens


def _compare(name: str, got: list[list[int]], reference: list[list[int]], ref_logits=None, bf16_error=None) -> dict:
    """ref_logits: the float32 reference's logits along `reference`, to measure the margin at each divergence."""
    divergences = []
    for prompt, (g, r) in enumerate(zip(got, reference)):
        at = next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), None)
        if at is not None and ref_logits is not None:
            logits = ref_logits[prompt][at]
            divergences.append({"prompt": prompt, "token": at,
                                "fp32_margin": float(logits[r[at]] - logits[g[at]]),
                                "hf_bf16_logit_error": float(bf16_error[prompt][at])})
    agree = sum(a == b for g, r in zip(got, reference) for a, b in zip(g, r))
    first = [next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), NEW_TOKENS) for g, r in zip(got, reference)]
    return {"run": name, "agreement": agree / (NUM_PROMPTS * NEW_TOKENS), "first_divergence": first,
            "divergences": divergences}


def agreement(shape: str) -> dict:
    hf_config, state = dummy_checkpoint(shape, torch.bfloat16, torch.device(DEVICE))
    prompts = _prompts(hf_config["vocab_size"])
    model = _hf_model(hf_config, state, torch.float32)
    reference, ref_logits = _hf_runs(model, prompts, None)
    top2 = torch.stack([l.topk(2, dim=-1).values for l in ref_logits])  # [prompts, 32, 2]
    model = model.to(torch.bfloat16)
    hf_bf16, bf16_logits = _hf_runs(model, prompts, reference)
    bf16_error = [(b - r).abs().amax(dim=-1).tolist() for b, r in zip(bf16_logits, ref_logits)]
    del model, bf16_logits
    torch.cuda.empty_cache()
    runs = {"hf_bf16": hf_bf16, "sluice_bf16": _sluice_greedy(hf_config, state, "bfloat16", prompts),
            "sluice_fp32": _sluice_greedy(hf_config, state, "float32", prompts)}
    errors = torch.tensor(bf16_error)
    return {
        "shape": shape,
        "reference": "HF transformers, float32, greedy",
        "fp32_top1_top2_margin_median": float((top2[..., 0] - top2[..., 1]).median()),
        "hf_bf16_logit_error_median": float(errors.median()),
        "runs": [_compare(name, tokens, reference, ref_logits, bf16_error) for name, tokens in runs.items()]
                + [_compare("sluice_bf16 vs hf_bf16", runs["sluice_bf16"], hf_bf16)],
    }


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "gpu_agreement.json"
    results = []
    for shape in sys.argv[2:] or ("Qwen3-0.6B", "Llama-3.1-8B"):
        results.append(agreement(shape))
        torch.cuda.empty_cache()
        for run in results[-1]["runs"]:
            ties = sum(d["fp32_margin"] <= d["hf_bf16_logit_error"] for d in run["divergences"])
            print(f"{shape:14} {run['run']:24} agreement {run['agreement']:6.1%}  first divergence "
                  f"{run['first_divergence']}  ({ties}/{len(run['divergences'])} divergences at a bf16 tie)",
                  flush=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
