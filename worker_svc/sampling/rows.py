"""Every live request's sampling parameters and history in one row of persistent tensors: a step gathers the rows of
the requests it samples instead of rebuilding them from Python lists, and records the sampled tokens in place.

A joining request's row is staged on the host and uploaded with the next gather, in one asynchronous copy per table:
writing device tensors element by element from Python would make the host wait for the device."""
from collections import Counter
from dataclasses import dataclass
from functools import reduce
from operator import and_, or_

import torch

from sluice.core.sampling_params import SamplingParams
from sluice.worker.sampling.bad_words import BadWords
from sluice.worker.sampling.ops import TOP_K_CANDIDATES, RandomDraws, SamplingTensors, SparseLogits, candidate_width
from sluice.worker.sampling.penalty_history import PenaltyHistory
from sluice.worker.sampling.upload import StagedRows, upload

_INITIAL_ROWS = 16
_FLOATS = ("temperature", "top_p", "min_p", "presence", "frequency", "repetition")  # float32 columns
_INTS = ("top_k", "num_output", "min_tokens", "seed_low", "seed_high")  # int64 columns
_F = {name: i for i, name in enumerate(_FLOATS)}
_I = {name: i for i, name in enumerate(_INTS)}


class RowUses:
    """What a row needs of a step's sampling, as bits found once when it joins: a step ORs (and ANDs) its rows' bits
    instead of asking every row's parameters one question at a time. Plain ints: an enum's operators cost a call."""

    DRAW = 1
    TOP_K = 2  # these three: a drawing row's filters
    TOP_P = 4
    MIN_P = 8
    PENALTIES = 16
    MIN_TOKENS = 32
    LOGIT_BIAS = 64
    BAD_WORDS = 128
    ALLOWED_TOKENS = 256
    CANDIDATES_SUFFICE = 512  # greedy, or a top-k small enough for a top-k step's candidates

    @classmethod
    def of(cls, params: SamplingParams) -> int:
        draws = not params.greedy
        uses = {cls.DRAW: draws, cls.TOP_K: draws and params.top_k > 0, cls.TOP_P: draws and params.top_p < 1,
                cls.MIN_P: draws and params.min_p > 0, cls.PENALTIES: params.has_penalties,
                cls.MIN_TOKENS: params.min_tokens > 0, cls.LOGIT_BIAS: bool(params.logit_bias),
                cls.BAD_WORDS: bool(params.bad_words_token_ids), cls.ALLOWED_TOKENS: bool(params.allowed_token_ids),
                cls.CANDIDATES_SUFFICE: not draws or 0 < params.top_k <= TOP_K_CANDIDATES // 2}
        return sum(flag for flag, used in uses.items() if used)


_FILTERS = RowUses.TOP_K | RowUses.TOP_P | RowUses.MIN_P


@dataclass(slots=True)
class _Row:
    index: int
    params: SamplingParams
    uses: int


class PaddedTable:
    """A list of (token id, value) pairs per row, of any length, padded with token id `pad_id` and value 0."""

    def __init__(self, num_rows: int, pad_id: int, device: torch.device):
        self.pad_id = pad_id
        self.device = device
        self.ids = torch.full((num_rows, 0), pad_id, dtype=torch.int64, device=device)
        self.values = torch.zeros(num_rows, 0, device=device)
        self._rows: StagedRows[tuple[list[int], list[float]]] = StagedRows()

    def set_row(self, row: int, ids: list[int], values: list[float]) -> None:
        self._rows.stage(row, (ids, values), bool(ids))

    def flush(self) -> None:
        staged = self._rows.take()
        if not staged:
            return
        width = max(self.ids.shape[1], *(len(ids) for ids, _ in staged.values()))
        if width > self.ids.shape[1]:
            self.ids = _pad(self.ids, 1, width - self.ids.shape[1], self.pad_id)
            self.values = _pad(self.values, 1, width - self.values.shape[1], 0.0)
        rows = upload(list(staged), torch.int64, self.device)
        padding = [width - len(ids) for ids, _ in staged.values()]
        self.ids[rows] = upload([ids + [self.pad_id] * pad for (ids, _), pad in zip(staged.values(), padding)],
                                torch.int64, self.device)
        self.values[rows] = upload([values + [0.0] * pad for (_, values), pad in zip(staged.values(), padding)],
                                   torch.float32, self.device)

    def add_rows(self, num_rows: int) -> None:
        self.ids = _pad(self.ids, 0, num_rows, self.pad_id)
        self.values = _pad(self.values, 0, num_rows, 0.0)


class SamplingRows:
    def __init__(self, vocab_size: int, eos_token_ids: tuple[int, ...], device: torch.device):
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.device = device
        self._rows: dict[str, _Row] = {}
        self._free = list(range(_INITIAL_ROWS - 1, -1, -1))
        self._floats = torch.zeros(_INITIAL_ROWS, len(_FLOATS), device=device)
        self._ints = torch.zeros(_INITIAL_ROWS, len(_INTS), dtype=torch.int64, device=device)
        self._ones = torch.ones(_INITIAL_ROWS, dtype=torch.int64, device=device)
        self._staged: dict[int, tuple[list[float], list[int]]] = {}  # row -> (floats, ints) to upload
        self._logit_bias = PaddedTable(_INITIAL_ROWS, vocab_size, device)
        self._min_tokens_bans = PaddedTable(_INITIAL_ROWS, vocab_size, device)  # EOS and stop ids, value -inf
        self._allowed = PaddedTable(_INITIAL_ROWS, vocab_size, device)  # allowed_token_ids (values unused)
        self._bad_words = BadWords(_INITIAL_ROWS, vocab_size, device)
        self._history: PenaltyHistory | None = None  # allocated with the first request that has penalties
        self.num_logprob_rows = 0  # live rows whose requests ask for logprobs

    def add(self, request_id: str, params: SamplingParams, seed: int, prompt_ids: list[int],
            output_ids: list[int]) -> None:
        if not self._free:
            self._grow()
        row = self._rows[request_id] = _Row(self._free.pop(), params, RowUses.of(params))
        self.num_logprob_rows += params.logprobs is not None
        i = row.index
        floats = [0.0 if params.greedy else params.temperature, params.top_p, params.min_p, params.presence_penalty,
                  params.frequency_penalty, params.repetition_penalty]
        ints = [params.top_k if params.top_k > 0 else self.vocab_size, len(output_ids), params.min_tokens,
                seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF]
        self._staged[i] = (floats, ints)
        self._logit_bias.set_row(i, list(params.logit_bias), list(params.logit_bias.values()))
        bans = self.eos_token_ids + params.stop_token_ids if params.min_tokens else []
        self._min_tokens_bans.set_row(i, bans, [float("-inf")] * len(bans))
        self._allowed.set_row(i, params.allowed_token_ids, [0.0] * len(params.allowed_token_ids))
        self._bad_words.set_row(i, params.bad_words_token_ids, output_ids)
        if params.has_penalties:
            if self._history is None:
                self._history = PenaltyHistory(self._ints.shape[0], self.vocab_size, self.device)
            self._history.set_row(i, prompt_ids, output_ids)
        elif self._history is not None:
            self._history.clear_row(i)

    def remove(self, request_id: str) -> None:
        row = self._rows.pop(request_id, None)
        if row is not None:
            self._free.append(row.index)
            self.num_logprob_rows -= row.params.logprobs is not None
            if self._history is not None:
                self._history.clear_row(row.index)

    def params(self, request_id: str) -> SamplingParams:
        return self._rows[request_id].params

    def indices(self, request_ids: list[str]) -> list[int]:
        return [self._rows[request_id].index for request_id in request_ids]

    def gather(self, request_ids: list[str], index: torch.Tensor,
               preceding: torch.Tensor | None = None) -> SamplingTensors:
        """The SamplingTensors of the requests, whose rows (`indices`) are `index`, already on the device, for a step
        that records a token for each; `allowed` holds allowed_token_ids only (the structured-output mask is the
        caller's). With proposals (speculative decoding), a request with k of them is listed on k + 1 consecutive
        rows, and preceding ([rows, k], NO_PROPOSAL past them) holds the proposals each row follows, which its
        penalties count."""
        self._flush()
        rows = [self._rows[request_id] for request_id in request_ids]
        uses = [row.uses for row in rows]
        any_uses, all_uses = reduce(or_, uses, 0), reduce(and_, uses, -1)
        tensors = SamplingTensors()
        draws, penalties, min_tokens = (bool(any_uses & use) for use in (RowUses.DRAW, RowUses.PENALTIES,
                                                                         RowUses.MIN_TOKENS))
        floats = self._floats[index] if draws or penalties else None  # an all-greedy batch gathers neither
        ints = self._ints[index] if draws or min_tokens else None
        if draws:
            tensors.draws = RandomDraws(
                temperature=floats[:, _F["temperature"]],
                top_k=ints[:, _I["top_k"]] if any_uses & RowUses.TOP_K else None,
                top_p=floats[:, _F["top_p"]] if any_uses & RowUses.TOP_P else None,
                min_p=floats[:, _F["min_p"]] if any_uses & RowUses.MIN_P else None,
                seeds=ints[:, _I["seed_low"]:_I["seed_high"] + 1],
                output_positions=ints[:, _I["num_output"]],
                filter_width=self._filter_width(rows, any_uses, all_uses))
        if penalties:
            listed = Counter(row.index for row in rows if row.uses & RowUses.PENALTIES)
            self._history.make_room(list(listed), [count - 1 for count in listed.values()])
            tensors.penalties = self._history.penalties(index, floats[:, _F["presence"]], floats[:, _F["frequency"]],
                                                        floats[:, _F["repetition"]], preceding)
        sparse = []
        if any_uses & RowUses.LOGIT_BIAS:
            sparse.append((self._logit_bias.ids[index], self._logit_bias.values[index]))
        if min_tokens:
            still_short = (ints[:, _I["num_output"]] < ints[:, _I["min_tokens"]]).unsqueeze(1)
            bans = self._min_tokens_bans
            sparse.append((bans.ids[index], torch.where(still_short, bans.values[index], 0.0)))
        if any_uses & RowUses.BAD_WORDS:
            sparse.append(self._bad_words.bans(index))
        if sparse:
            tensors.sparse = SparseLogits(torch.cat([ids for ids, _ in sparse], dim=1),
                                          torch.cat([values for _, values in sparse], dim=1))
        if any_uses & RowUses.ALLOWED_TOKENS:
            listed = torch.zeros(len(rows), self.vocab_size + 1, dtype=torch.bool, device=self.device)
            listed = listed.scatter_(1, self._allowed.ids[index], True)[:, :self.vocab_size]  # padding lands past it
            tensors.allowed = listed | ~listed.any(dim=1, keepdim=True)  # a row with no list allows every token
        return tensors

    def _filter_width(self, rows: list[_Row], any_uses: int, all_uses: int) -> int | None:
        """None when no drawing row filters; the candidates of a top-k step when every drawing row has a small
        top-k; else the whole vocabulary."""
        if not any_uses & _FILTERS:
            return None
        if all_uses & RowUses.CANDIDATES_SUFFICE:
            return candidate_width(max(row.params.top_k for row in rows if row.uses & RowUses.DRAW), self.vocab_size)
        return self.vocab_size

    def record(self, index: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Counts one sampled token for each row in `index`."""
        self._ints[:, _I["num_output"]].index_add_(0, index, self._ones[:index.shape[0]])
        self._bad_words.record(index, token_ids)
        if self._history is not None:
            self._history.record(index, token_ids)

    def record_accepted(self, index: torch.Tensor, accepted_ids: torch.Tensor) -> None:
        """Counts the accepted proposals of each row in `index` (accepted_ids: [len(index), k], NO_PROPOSAL past
        them) as output tokens, before record counts the sampled one."""
        self._ints[:, _I["num_output"]].index_add_(0, index, (accepted_ids >= 0).sum(dim=1))
        if self._history is not None:
            self._history.record_accepted(index, accepted_ids)

    def accepted_on_host(self, request_id: str, num_accepted: int) -> None:
        """The request's accepted proposals, now known on the host (they take room in the penalty history)."""
        if self._history is not None and request_id in self._rows:
            self._history.accepted(self._rows[request_id].index, num_accepted)

    def _flush(self) -> None:
        if self._staged:
            rows = upload(list(self._staged), torch.int64, self.device)
            self._floats[rows] = upload([floats for floats, _ in self._staged.values()], torch.float32, self.device)
            self._ints[rows] = upload([ints for _, ints in self._staged.values()], torch.int64, self.device)
            self._staged.clear()
        for table in (self._logit_bias, self._min_tokens_bans, self._allowed, self._bad_words):
            table.flush()
        if self._history is not None:
            self._history.flush()

    def _grow(self) -> None:
        num_rows = self._ints.shape[0]
        self._floats = _pad(self._floats, 0, num_rows, 0)
        self._ints = _pad(self._ints, 0, num_rows, 0)
        self._ones = _pad(self._ones, 0, num_rows, 1)
        for table in (self._logit_bias, self._min_tokens_bans, self._allowed, self._bad_words):
            table.add_rows(num_rows)
        if self._history is not None:
            self._history.add_rows(num_rows)
        self._free.extend(range(2 * num_rows - 1, num_rows - 1, -1))


def _pad(tensor: torch.Tensor, dim: int, size: int, fill) -> torch.Tensor:
    shape = list(tensor.shape)
    shape[dim] = size
    return torch.cat([tensor, torch.full(shape, fill, dtype=tensor.dtype, device=tensor.device)], dim=dim)
