"""Structured output in the worker: one llguidance matcher per constrained request. Each step fills the batch's
token bitmask before sampling and advances the matchers with the sampled tokens. A request whose constraint cannot
go on (no token continues its text) loses its matcher and is reported, so the scheduler fails it."""
from collections.abc import Callable
from pathlib import Path

import llguidance
import llguidance.numpy
import torch

from sluice.core.grammar import grammar_for, matcher_error
from sluice.core.sampling_params import SamplingParams


def load_llguidance_tokenizer(model_path: Path, vocab_size: int,
                              eos_token_ids: tuple[int, ...]) -> llguidance.LLTokenizer:
    import llguidance.hf  # imports transformers, as the next line does: a worker of random weights needs neither
    from transformers import AutoTokenizer

    if model_path.suffix == ".gguf":
        hf_tokenizer = AutoTokenizer.from_pretrained(model_path.parent, gguf_file=model_path.name)
    else:
        hf_tokenizer = AutoTokenizer.from_pretrained(model_path)
    return llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=list(eos_token_ids) or None)


class GrammarMatchers:
    def __init__(self, load_tokenizer: Callable[[], llguidance.LLTokenizer] | None, vocab_size: int,
                 device: torch.device):
        self._load_tokenizer = load_tokenizer
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._executor: llguidance.LLExecutor | None = None
        self.vocab_size = vocab_size
        self.device = device
        self._matchers: dict[str, llguidance.LLMatcher] = {}
        self._errors: dict[str, str] = {}  # request id -> why its constraint cannot go on, not yet reported
        self._bit_positions = torch.arange(32, dtype=torch.int32, device=device)

    def add(self, request_id: str, params: SamplingParams, output_ids: list[int]) -> None:
        grammar = grammar_for(params)
        if grammar is None:
            return
        if self._load_tokenizer is None:
            self._errors[request_id] = "this worker has no tokenizer for structured output"
            return
        if self._tokenizer is None:
            self._tokenizer = self._load_tokenizer()
            self._executor = llguidance.LLExecutor()
        matcher = llguidance.LLMatcher(self._tokenizer, grammar)
        matcher.consume_tokens(output_ids)
        self._matchers[request_id] = matcher
        self._drop_if_failed(request_id, matcher)

    def remove(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)
        self._errors.pop(request_id, None)

    def take_errors(self) -> dict[str, str]:
        """The requests whose constraint failed since the last call, and why."""
        errors, self._errors = self._errors, {}
        return errors

    @property
    def active(self) -> bool:
        """Some live request is constrained."""
        return bool(self._matchers)

    def constrains(self, request_ids: list[str]) -> bool:
        return any(request_id in self._matchers for request_id in request_ids)

    def allowed_tokens(self, row_request_ids: list[str],
                       proposals: dict[str, list[int]] | None = None) -> torch.Tensor | None:
        """[rows, vocab] bool: the tokens each row's grammar allows next (all on unconstrained rows), or None when no
        row is constrained. A request's rows are consecutive; with proposals, its first row is its next token's and
        row j follows its first j proposals (all tokens after a proposal the grammar rejects: acceptance ends there)."""
        first_rows: dict[str, int] = {}
        for row, request_id in enumerate(row_request_ids):
            first_rows.setdefault(request_id, row)
        proposals = proposals or {}
        constrained = [(request_id, row) for request_id, row in first_rows.items() if request_id in self._matchers]
        if not constrained:
            return None
        bitmask = llguidance.numpy.allocate_token_bitmask(len(row_request_ids), self.vocab_size)
        proposing = [(self._matchers[r], row, proposals[r]) for r, row in constrained if proposals.get(r)]
        if proposing:
            llguidance.numpy.fill_next_token_bitmask_par_with_draft_tokens(self._executor, proposing, bitmask)
        if len(proposing) < len(constrained):
            llguidance.numpy.fill_next_token_bitmask_par(
                self._executor, [(self._matchers[r], row) for r, row in constrained if not proposals.get(r)], bitmask)
        for request_id, _ in constrained:  # a mask without a token that continues fails the matcher
            self._drop_if_failed(request_id, self._matchers[request_id])
        words = torch.from_numpy(bitmask).to(self.device)
        bits = (words.unsqueeze(-1) >> self._bit_positions) & 1  # [rows, words, 32]
        return bits.flatten(1)[:, :self.vocab_size].bool()

    def advance(self, request_ids: list[str], token_ids: list[int],
                accepted_token_ids: dict[str, list[int]]) -> dict[str, int]:
        """Feeds each constrained request its accepted proposals, then its sampled token, up to the token that
        completes its grammar; returns the requests whose grammar is now complete, each with how many of those
        tokens it took."""
        completed = {}
        for request_id, token_id in zip(request_ids, token_ids):
            matcher = self._matchers.get(request_id)
            if matcher is None:
                continue
            for num_taken, token in enumerate([*accepted_token_ids.get(request_id, ()), token_id], 1):
                matcher.consume_token(token)
                if self._drop_if_failed(request_id, matcher):
                    break
                if matcher.is_stopped():
                    completed[request_id] = num_taken
                    break
        return completed

    def _drop_if_failed(self, request_id: str, matcher: llguidance.LLMatcher) -> bool:
        """Drops the request's matcher, recording why, once it cannot go on. True if it was dropped."""
        error = matcher_error(matcher)
        if error is None:
            return False
        del self._matchers[request_id]
        self._errors[request_id] = error
        return True
