"""vLLM's bad_words on the device: each live request's banned token sequences next to its newest output tokens.

A step bans a sequence's last token where the tokens before it are the request's newest, and records the tokens it
samples, all in batched tensor ops: the newest tokens need never reach the host first, so steps stay asynchronous.
"""
import torch

from sluice.worker.sampling.upload import StagedRows, upload

PAD = -1  # a sequence's padding matches any token; the history's marks "no token yet"


class BadWords:
    """Per row: sequences [words, length], right-aligned and padded in front; unused word slots end in `vocab_size`
    (one past the vocabulary, where a ban lands harmlessly). History [length - 1]: the newest output tokens."""

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.device = device
        self._words = torch.full((num_rows, 0, 1), vocab_size, dtype=torch.int64, device=device)
        self._history = torch.full((num_rows, 0), PAD, dtype=torch.int64, device=device)
        self._rows: StagedRows[tuple[list[list[int]], list[int]]] = StagedRows()  # (sequences, output ids)

    def set_row(self, row: int, sequences: list[list[int]], output_ids: list[int]) -> None:
        self._rows.stage(row, (sequences, output_ids), bool(sequences))

    def flush(self) -> None:
        staged = self._rows.take()
        num_words = max([self._words.shape[1], *(len(sequences) for sequences, _ in staged.values())])
        if not staged or not num_words:  # nothing to write: rows cleared before any sequence reached the device
            return
        length = max([self._words.shape[2], *(len(s) for sequences, _ in staged.values() for s in sequences)])
        self._widen(num_words, length)
        rows = upload(list(staged), torch.int64, self.device)
        self._words[rows] = upload([self._padded_words(sequences) for sequences, _ in staged.values()],
                                   torch.int64, self.device)
        if length > 1:
            self._history[rows] = upload([([PAD] * length + output_ids)[-(length - 1):]
                                          for _, output_ids in staged.values()], torch.int64, self.device)

    def bans(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids, values) [len(index), words]: -inf on each sequence's last token where the tokens before it
        are the row's newest output tokens, else 0."""
        words = self._words[index]
        prefix = words[:, :, :-1]
        matched = ((prefix == self._history[index].unsqueeze(1)) | (prefix == PAD)).all(dim=2)
        return words[:, :, -1], torch.where(matched, float("-inf"), 0.0)

    def record(self, index: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Appends each row's sampled token to its history, while some row has sequences that need one."""
        if self._history.shape[1] and self._rows.any_filled:
            self._history[index] = torch.cat([self._history[index, 1:], token_ids.unsqueeze(1)], dim=1)

    def add_rows(self, num_rows: int) -> None:
        words, history = self._words, self._history
        self._words = torch.cat([words, torch.full((num_rows, *words.shape[1:]), self.vocab_size,
                                                   dtype=torch.int64, device=self.device)])
        self._history = torch.cat([history, torch.full((num_rows, history.shape[1]), PAD, dtype=torch.int64,
                                                       device=self.device)])

    def _widen(self, num_words: int, length: int) -> None:
        rows, old_words, old_length = self._words.shape
        if (num_words, length) == (old_words, old_length):
            return
        words = torch.full((rows, num_words, length), PAD, dtype=torch.int64, device=self.device)
        words[:, :, -1] = self.vocab_size
        words[:, :old_words, length - old_length:] = self._words
        history = torch.full((rows, length - 1), PAD, dtype=torch.int64, device=self.device)
        history[:, length - old_length:] = self._history
        self._words, self._history = words, history

    def _padded_words(self, sequences: list[list[int]]) -> list[list[int]]:
        num_words, length = self._words.shape[1:]
        unused = [PAD] * (length - 1) + [self.vocab_size]
        return [[PAD] * (length - len(s)) + s for s in sequences] + [unused] * (num_words - len(sequences))
