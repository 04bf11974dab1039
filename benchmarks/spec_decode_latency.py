"""Batch-1 time per output token with and without ngram speculative decoding, in process (the real Scheduler and
WorkerEngine), greedy, on a prompt that quotes its context; prints the acceptance rate and checks that both runs give
the same tokens. Run: python benchmarks/spec_decode_latency.py [--model DIR --device cpu --max-tokens 96]"""
import argparse
import statistics
import time
from pathlib import Path

from sluice.cli.model_store import default_model
from sluice.cli.offline import OfflineEngine
from sluice.core.sampling_params import SamplingParams
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine

PARAGRAPH = ("The river rises in the northern hills, runs south through three market towns, and meets the sea at a "
             "wide, shallow bay where herons feed at low tide. In spring the water is brown with melted snow; by "
             "late summer it is clear enough to count the stones on its bed, and children wade across at the ford "
             "below the old mill.")
PROMPT = f"Repeat the following paragraph word for word.\nParagraph: {PARAGRAPH}\nRepeated paragraph:"


def ms_per_token(engine: OfflineEngine, prompt: list[int], max_tokens: int, runs: int) -> tuple[float, list[int]]:
    """The median over runs of (a whole generation less a one-token one) per output token after the first."""
    timings, tokens = [], []
    for _ in range(runs):
        started = time.perf_counter()
        engine.generate([prompt], [SamplingParams(max_tokens=1, temperature=0.0)])
        first = time.perf_counter() - started
        started = time.perf_counter()
        tokens = engine.generate([prompt], [SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)])
        timings.append((time.perf_counter() - started - first) / (max_tokens - 1) * 1000)
    return statistics.median(timings), tokens[0].token_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--ngram-min", type=int, default=2)
    parser.add_argument("--ngram-max", type=int, default=4)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    model = args.model or default_model()
    tokenizer = AutoTokenizer.from_pretrained(model)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                         tokenize=False)
    prompt = tokenizer(chat, add_special_tokens=False).input_ids
    worker = WorkerEngine.load(WorkerConfig(model=str(model), device=args.device))
    results = {}
    for method in (None, "ngram"):
        engine = OfflineEngine(worker, enable_prefix_caching=False, speculative_method=method,
                               num_speculative_tokens=args.num_speculative_tokens, ngram_min=args.ngram_min,
                               ngram_max=args.ngram_max)
        engine.generate([prompt], [SamplingParams(max_tokens=4, temperature=0.0)])  # warm-up
        results[method] = ms_per_token(engine, prompt, args.max_tokens, args.runs)
        load = engine.scheduler.get_load()
        rate = load.num_accepted_tokens / load.num_draft_tokens if load.num_draft_tokens else 0.0
        print(f"speculative method {method}: {results[method][0]:.1f} ms per output token (batch 1, "
              f"{len(prompt)}-token prompt, {args.max_tokens} tokens); proposals accepted {load.num_accepted_tokens}"
              f" of {load.num_draft_tokens} ({rate:.0%}), accepted per position "
              f"{load.num_accepted_tokens_per_position}, {load.num_drafts} request-steps with proposals")
    assert results[None][1] == results["ngram"][1], "speculation changed the greedy tokens"


if __name__ == "__main__":
    main()
