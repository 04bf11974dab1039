"""What the repetition, frequency and presence penalties read, kept on the device for every row: the row's prompt and
output tokens, and how often each token was generated. A step's sampled tokens are appended and counted in place
(one indexed write each for the batch); a step reads only its rows' tokens, never a [rows, vocab] table."""
import torch

from sluice.worker.sampling.ops import Penalties
from sluice.worker.sampling.upload import upload


class PenaltyHistory:
    """Tokens [rows, width]: a row's history, then copies of its first token (which change nothing, since they
    penalise that token as its first entry does); output counts [rows, vocab]. Rows of requests without penalties
    hold stale history that no penalty reads."""

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.device = device
        self._token_ids = torch.zeros(num_rows, 0, dtype=torch.int64, device=device)
        self._lengths = torch.zeros(num_rows, dtype=torch.int64, device=device)
        self._output_counts = torch.zeros(num_rows, vocab_size, dtype=torch.int32, device=device)
        self._num_tokens: dict[int, int] = {}  # row -> its history's length, for rows with penalties
        self._staged: dict[int, tuple[list[int], list[int]]] = {}  # row -> (prompt ids, output ids) to upload

    def set_row(self, row: int, prompt_ids: list[int], output_ids: list[int]) -> None:
        self._staged[row] = (prompt_ids, output_ids)
        self._num_tokens[row] = len(prompt_ids) + len(output_ids)

    def clear_row(self, row: int) -> None:
        self._staged.pop(row, None)
        self._num_tokens.pop(row, None)

    def make_room(self, rows: list[int], num_proposals: list[int]) -> None:
        """Room for a step that records, for each of `rows`, its accepted proposals (at most num_proposals) and one
        sampled token; the accepted ones are counted on the host by accepted()."""
        self._widen(max(self._num_tokens.get(row, 0) + count for row, count in zip(rows, num_proposals)) + 1)
        for row in rows:
            if row in self._num_tokens:
                self._num_tokens[row] += 1

    def accepted(self, row: int, num_accepted: int) -> None:
        if row in self._num_tokens:
            self._num_tokens[row] += num_accepted

    def penalties(self, index: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor,
                  repetition: torch.Tensor, preceding: torch.Tensor | None = None) -> Penalties:
        """The Penalties of the rows `index`. preceding: [len(index), k] the proposals each row comes after
        (speculative decoding; NO_PROPOSAL past them), which count as output tokens there."""
        token_ids = self._token_ids[index]
        if preceding is None:
            return Penalties(presence, frequency, repetition, token_ids,
                             self._output_counts[index.unsqueeze(1), token_ids])
        token_ids = torch.cat([token_ids, torch.where(preceding >= 0, preceding, token_ids[:, :1])], dim=1)
        counts = self._output_counts[index.unsqueeze(1), token_ids]
        counts += (token_ids.unsqueeze(2) == preceding.unsqueeze(1)).sum(dim=2, dtype=torch.int32)
        return Penalties(presence, frequency, repetition, token_ids, counts)

    def record(self, index: torch.Tensor, token_ids: torch.Tensor) -> None:
        last = self._token_ids.shape[1] - 1  # where rows without penalties write, unread
        self._token_ids[index, self._lengths[index].clamp(max=last)] = token_ids
        self._lengths.index_add_(0, index, torch.ones_like(index))
        self._count(index, token_ids)

    def record_accepted(self, index: torch.Tensor, accepted_ids: torch.Tensor) -> None:
        """accepted_ids: [len(index), k] each row's accepted proposals, then NO_PROPOSAL; positions past a row's
        accepted ones get its first token, which changes nothing."""
        last = self._token_ids.shape[1] - 1
        accepted = accepted_ids >= 0
        positions = (self._lengths[index].unsqueeze(1) + torch.arange(accepted_ids.shape[1], device=self.device))
        self._token_ids[index.unsqueeze(1), positions.clamp(max=last)] = torch.where(
            accepted, accepted_ids, self._token_ids[index, :1])
        self._lengths.index_add_(0, index, accepted.sum(dim=1))
        self._output_counts.view(-1).index_add_(0, (index.unsqueeze(1) * self.vocab_size + accepted_ids.clamp(min=0))
                                                .flatten(), accepted.flatten().int())

    def flush(self) -> None:
        if not self._staged:
            return
        staged, self._staged = self._staged, {}
        histories = [prompt_ids + output_ids for prompt_ids, output_ids in staged.values()]
        self._widen(max(map(len, histories)))
        width = self._token_ids.shape[1]
        rows = upload(list(staged), torch.int64, self.device)
        self._token_ids[rows] = upload([ids + ids[:1] * (width - len(ids)) for ids in histories], torch.int64,
                                       self.device)
        self._lengths[rows] = upload(list(map(len, histories)), torch.int64, self.device)
        self._output_counts[rows] = 0
        outputs = [(row, token_id) for row, (_, output_ids) in staged.items() for token_id in output_ids]
        if outputs:
            counted = upload(outputs, torch.int64, self.device)
            self._count(counted[:, 0], counted[:, 1])

    def _count(self, rows: torch.Tensor, token_ids: torch.Tensor) -> None:
        """One more output of each (row, token) pair, in one atomic add over the flat counts (an accumulating
        index_put_ sorts its indices first: about 0.3 ms of host launch per step on an H200 host)."""
        self._output_counts.view(-1).index_add_(0, rows * self.vocab_size + token_ids,
                                                torch.ones_like(token_ids, dtype=torch.int32))

    def add_rows(self, num_rows: int) -> None:
        zeros = torch.zeros(num_rows, dtype=torch.int64, device=self.device)
        self._token_ids = torch.cat([self._token_ids, zeros.unsqueeze(1).expand(-1, self._token_ids.shape[1])])
        self._lengths = torch.cat([self._lengths, zeros])
        self._output_counts = torch.cat([self._output_counts, self._output_counts.new_zeros(num_rows,
                                                                                           self.vocab_size)])

    def _widen(self, width: int) -> None:
        old = self._token_ids.shape[1]
        if width > old:
            first = self._token_ids[:, :1] if old else self._token_ids.new_zeros(self._token_ids.shape[0], 1)
            self._token_ids = torch.cat([self._token_ids, first.expand(-1, max(width, 2 * old) - old)], dim=1)
