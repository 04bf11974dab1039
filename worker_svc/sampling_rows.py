"""Every live request's sampling parameters and history in one row of persistent tensors: a step gathers the rows of
the requests it samples instead of rebuilding them from Python lists, and records the sampled tokens in place."""
from dataclasses import dataclass

import torch

from sluice.sampling_params import SamplingParams
from worker_svc.sampler import Penalties, SamplingTensors, SparseLogits

_INITIAL_ROWS = 16
_SCALARS = {
    "temperature": torch.float32, "top_k": torch.int64, "top_p": torch.float32, "min_p": torch.float32,
    "presence": torch.float32, "frequency": torch.float32, "repetition": torch.float32,
    "num_output": torch.int64, "min_tokens": torch.int64,
}


@dataclass(slots=True)
class _Row:
    index: int
    params: SamplingParams


class PaddedTable:
    """A list of (token id, value) pairs per row, of any length, padded with token id `pad_id` and value 0."""

    def __init__(self, num_rows: int, pad_id: int, device: torch.device):
        self.pad_id = pad_id
        self.ids = torch.full((num_rows, 0), pad_id, dtype=torch.int64, device=device)
        self.values = torch.zeros(num_rows, 0, device=device)

    def set_row(self, row: int, ids: list[int], values: list[float]) -> None:
        if len(ids) > self.ids.shape[1]:
            self.ids = _pad(self.ids, 1, len(ids) - self.ids.shape[1], self.pad_id)
            self.values = _pad(self.values, 1, len(ids) - self.values.shape[1], 0.0)
        self.ids[row] = self.pad_id
        self.values[row] = 0.0
        self.ids[row, :len(ids)] = torch.tensor(ids, dtype=torch.int64)
        self.values[row, :len(ids)] = torch.tensor(values, dtype=torch.float32)

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
        self._scalars = {name: torch.zeros(_INITIAL_ROWS, dtype=dtype, device=device)
                         for name, dtype in _SCALARS.items()}
        self._seeds = torch.zeros(_INITIAL_ROWS, 2, dtype=torch.int64, device=device)  # low, high 32 bits
        self._logit_bias = PaddedTable(_INITIAL_ROWS, vocab_size, device)
        self._min_tokens_bans = PaddedTable(_INITIAL_ROWS, vocab_size, device)  # EOS and stop ids, value -inf
        # allocated with the first request that has penalties; rows of other requests hold stale history
        self._output_counts: torch.Tensor | None = None  # [rows, vocab] int32
        self._prompt_mask: torch.Tensor | None = None  # [rows, vocab] bool

    def add(self, request_id: str, params: SamplingParams, seed: int, prompt_ids: list[int],
            output_ids: list[int]) -> None:
        if not self._free:
            self._grow()
        row = self._rows[request_id] = _Row(self._free.pop(), params)
        i = row.index
        values = {"temperature": 0.0 if params.greedy else params.temperature,
                  "top_k": params.top_k if params.top_k > 0 else self.vocab_size, "top_p": params.top_p,
                  "min_p": params.min_p, "presence": params.presence_penalty, "frequency": params.frequency_penalty,
                  "repetition": params.repetition_penalty, "num_output": len(output_ids),
                  "min_tokens": params.min_tokens}
        for name, value in values.items():
            self._scalars[name][i] = value
        self._seeds[i, 0], self._seeds[i, 1] = seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF
        self._logit_bias.set_row(i, list(params.logit_bias), list(params.logit_bias.values()))
        bans = self.eos_token_ids + params.stop_token_ids if params.min_tokens else []
        self._min_tokens_bans.set_row(i, bans, [float("-inf")] * len(bans))
        if params.has_penalties:
            self._set_history(i, prompt_ids, output_ids)

    def remove(self, request_id: str) -> None:
        row = self._rows.pop(request_id, None)
        if row is not None:
            self._free.append(row.index)

    def params(self, request_id: str) -> SamplingParams:
        return self._rows[request_id].params

    def indices(self, request_ids: list[str]) -> list[int]:
        return [self._rows[request_id].index for request_id in request_ids]

    def gather(self, request_ids: list[str], index: torch.Tensor) -> SamplingTensors:
        """The SamplingTensors (less the structured-output mask) of the requests, whose rows (`indices`) are `index`,
        already on the device."""
        params = [self._rows[request_id].params for request_id in request_ids]
        column = {name: tensor[index] for name, tensor in self._scalars.items()}
        tensors = SamplingTensors(
            temperature=column["temperature"], top_k=column["top_k"], top_p=column["top_p"], min_p=column["min_p"],
            seeds=self._seeds[index], output_positions=column["num_output"],
            all_greedy=all(p.greedy for p in params),
            needs_filter=any(p.top_k > 0 or p.top_p < 1 or p.min_p > 0 for p in params),
        )
        if any(p.has_penalties for p in params):
            tensors.penalties = Penalties(column["presence"], column["frequency"], column["repetition"],
                                          self._output_counts[index], self._prompt_mask[index])
        sparse = []
        if any(p.logit_bias for p in params):
            sparse.append((self._logit_bias.ids[index], self._logit_bias.values[index]))
        if any(p.min_tokens for p in params):
            still_short = (column["num_output"] < column["min_tokens"]).unsqueeze(1)
            bans = self._min_tokens_bans
            sparse.append((bans.ids[index], torch.where(still_short, bans.values[index], 0.0)))
        if sparse:
            tensors.sparse = SparseLogits(torch.cat([ids for ids, _ in sparse], dim=1),
                                          torch.cat([values for _, values in sparse], dim=1))
        return tensors

    def record(self, index: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Counts one sampled token for each row in `index`."""
        self._scalars["num_output"][index] += 1
        if self._output_counts is not None:
            ones = torch.ones_like(token_ids, dtype=torch.int32)
            self._output_counts.index_put_((index, token_ids), ones, accumulate=True)

    def _set_history(self, i: int, prompt_ids: list[int], output_ids: list[int]) -> None:
        if self._output_counts is None:
            num_rows = len(self._scalars["num_output"])
            self._output_counts = torch.zeros(num_rows, self.vocab_size, dtype=torch.int32, device=self.device)
            self._prompt_mask = torch.zeros(num_rows, self.vocab_size, dtype=torch.bool, device=self.device)
        outputs = torch.tensor(output_ids, dtype=torch.int64, device=self.device)
        self._output_counts[i] = torch.bincount(outputs, minlength=self.vocab_size)
        self._prompt_mask[i] = False
        self._prompt_mask[i, torch.tensor(prompt_ids, dtype=torch.int64, device=self.device)] = True

    def _grow(self) -> None:
        num_rows = len(self._scalars["num_output"])
        self._scalars = {name: _pad(tensor, 0, num_rows, 0) for name, tensor in self._scalars.items()}
        self._seeds = _pad(self._seeds, 0, num_rows, 0)
        self._logit_bias.add_rows(num_rows)
        self._min_tokens_bans.add_rows(num_rows)
        if self._output_counts is not None:
            self._output_counts = _pad(self._output_counts, 0, num_rows, 0)
            self._prompt_mask = _pad(self._prompt_mask, 0, num_rows, False)
        self._free.extend(range(2 * num_rows - 1, num_rows - 1, -1))


def _pad(tensor: torch.Tensor, dim: int, size: int, fill) -> torch.Tensor:
    shape = list(tensor.shape)
    shape[dim] = size
    return torch.cat([tensor, torch.full(shape, fill, dtype=tensor.dtype, device=tensor.device)], dim=dim)
