"""One sample's output cut at its first stop string: the tokens up to the one that completes it, and their text."""
from sluice.core.finish_reason import FinishReason
from sluice.core.sampling_params import SamplingParams
from sluice.router.schedulers.messages import Finished
from sluice.router.stop_strings import StopStringMatcher


class SampleStops:
    def __init__(self, tokenizer, params: SamplingParams, with_text: bool):
        """with_text False: the text is wanted only to find stop strings, so a sample without them is not
        detokenized."""
        self._stop = StopStringMatcher(params.stop, params.include_stop_str_in_output) if params.stop else None
        self._detokenizer = tokenizer.detokenizer() if with_text or self._stop is not None else None
        self.num_tokens = 0  # taken so far; after a stop string, up to the token that completed it

    @property
    def matched(self) -> str | None:
        """The stop string that ended the sample, once one has."""
        return None if self._stop is None else self._stop.matched

    def take(self, token_ids: list[int]) -> tuple[str, list[int]]:
        """The text of the new tokens and the tokens, up to the one that completes a stop string; nothing once one
        has matched."""
        if self.matched is not None:
            return "", []
        text, token_ids = self._cut(token_ids)
        self.num_tokens += len(token_ids)
        return text, token_ids

    def end(self, finished: Finished) -> tuple[str, FinishReason, int]:
        """The text held back for a stop string that never came, the sample's finish reason and its number of
        tokens."""
        tail = self._stop.flush() if self._stop is not None else ""
        if self.matched is not None:
            return tail, FinishReason.STOP, self.num_tokens
        return tail, finished.reason, finished.usage.completion_tokens

    def _cut(self, token_ids: list[int]) -> tuple[str, list[int]]:
        if self._detokenizer is None:
            return "", token_ids
        if self._stop is None:
            return self._detokenizer.push(token_ids), token_ids
        parts = []
        for num_taken, token_id in enumerate(token_ids, 1):
            parts.append(self._stop.push(self._detokenizer.push([token_id])))
            if self._stop.matched is not None:
                return "".join(parts), token_ids[:num_taken]
        return "".join(parts), token_ids
