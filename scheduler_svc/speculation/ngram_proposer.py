"""Prompt lookup: a request's next tokens are guessed by finding its newest n tokens earlier in its prompt and output
and proposing the tokens that followed them there (n from ngram_max down to ngram_min; the latest match wins).

Each request's tokens are kept as packed int32 bytes, extended by the tokens added since the last proposal, so a
lookup is one bytes.rfind in C per n rather than a Python loop over the tokens."""
from array import array

from sluice.scheduler.request import Request

_TOKEN_BYTES = array("i").itemsize


class NgramProposer:
    def __init__(self, ngram_min: int, ngram_max: int):
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self._packed: dict[str, bytearray] = {}  # request id -> its tokens, as int32

    def propose(self, request: Request, max_num_tokens: int) -> list[int]:
        """Up to max_num_tokens tokens that followed the longest earlier match of the request's newest tokens."""
        tokens = request.all_token_ids
        packed = self._packed.setdefault(request.request_id, bytearray())
        num_packed = len(packed) // _TOKEN_BYTES
        if num_packed < len(tokens):
            packed.extend(array("i", tokens[num_packed:]).tobytes())
        end = (len(tokens) - 1) * _TOKEN_BYTES  # a match must be followed by a token
        shortest = self.ngram_min
        if len(tokens) <= shortest or (start := _latest_match(packed, packed[-shortest * _TOKEN_BYTES:], end)) is None:
            return []  # without a match of the shortest suffix there is none of a longer one
        match = start + shortest
        for n in range(min(self.ngram_max, len(tokens) - 1), shortest, -1):
            if (start := _latest_match(packed, packed[-n * _TOKEN_BYTES:], end)) is not None:
                match = start + n
                break
        return tokens[match:match + max_num_tokens]

    def forget(self, request_id: str) -> None:
        self._packed.pop(request_id, None)


def _latest_match(packed: bytearray, pattern: bytes, end: int) -> int | None:
    """The token index of the last occurrence of `pattern` that ends at or before byte `end`, whole tokens only."""
    while (found := packed.rfind(pattern, 0, end)) >= 0:
        if found % _TOKEN_BYTES == 0:
            return found // _TOKEN_BYTES
        end = found + len(pattern) - 1  # a match across token boundaries: look further back
    return None
