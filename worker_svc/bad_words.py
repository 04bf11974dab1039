"""vLLM's bad_words on the device: each live request's banned token sequences next to its newest output tokens.

A step bans a sequence's last token where the tokens before it are the request's newest, and records the tokens it
samples, all in batched tensor ops: the newest tokens need never reach the host first, so steps stay asynchronous.
"""
import torch

from worker_svc.upload import upload

PAD = -1  # a sequence's padding matches any token; the history's marks "no token yet"


class BadWords:
    """Per row: sequences [words, length], right-aligned and padded in front; unused word slots end in `vocab_size`
    (one past the vocabulary, where a ban lands harmlessly). History [length - 1]: the newest output tokens."""

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.device = device
        self._words = torch.full((num_rows, 0, 1), vocab_size, dtype=torch.int64, device=device)
        self._history = torch.full((num_rows, 0), PAD, dtype=torch.int64, device=device)
        self._staged: dict[int, tuple[list[list[int]], list[int]]] = {}
        self._filled: set[int] = set()  # rows that hold sequences on the device

    def set_row(self, row: int, sequences: list[list[int]], output_ids: list[int]) -> None:
        if sequences or row in self._filled or row in self._staged:
            self._staged[row] = (sequences, output_ids)

    def flush(self) -> None:
        if not self._staged:
            return
        num_words = max([self._words.shape[1], *(len(sequences) for sequences, _ in self._staged.values())])
        length = max([self._words.shape[2], *(len(s) for sequences, _ in self._staged.values() for s in sequences)])
        if not num_words:  # rows cleared before any sequence reached the device
            self._staged.clear()
            return
        self._widen(num_words, length)
        rows = upload(list(self._staged), torch.int64, self.device)
        self._words[rows] = upload([self._padded_words(sequences) for sequences, _ in self._staged.values()],
                                   torch.int64, self.device)
        if length > 1:
            self._history[rows] = upload([([PAD] * length + output_ids)[-(length - 1):]
                                          for _, output_ids in self._staged.values()], torch.int64, self.device)
        self._filled.update(row for row, (sequences, _) in self._staged.items() if sequences)
        self._filled.difference_update(row for row, (sequences, _) in self._staged.items() if not sequences)
        self._staged.clear()

    def bans(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids, values) [len(index), words]: -inf on each sequence's last token where the tokens before it
        are the row's newest output tokens, else 0."""
        words = self._words[index]
        prefix = words[:, :, :-1]
        matched = ((prefix == self._history[index].unsqueeze(1)) | (prefix == PAD)).all(dim=2)
        return words[:, :, -1], torch.where(matched, float("-inf"), 0.0)

    def record(self, index: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Appends each row's sampled token to its history."""
        if self._history.shape[1]:
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
