"""Host-to-device writes that never make the host wait for the device."""
from typing import Generic, TypeVar

import torch

T = TypeVar("T")


def upload(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list on the device, copied without waiting for the device (through pinned memory on a GPU)."""
    host = torch.tensor(values, dtype=dtype)
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)


class StagedRows(Generic[T]):
    """Row contents of a device table, held on the host until the table's next upload. A row is staged when it gets
    content, and also when it gets none while the device or a pending upload holds some for it: a reused row is
    cleared."""

    def __init__(self):
        self._staged: dict[int, tuple[T, bool]] = {}
        self._filled: set[int] = set()  # rows that hold content on the device

    def stage(self, row: int, content: T, has_content: bool) -> None:
        if has_content or row in self._filled or row in self._staged:
            self._staged[row] = (content, has_content)

    def take(self) -> dict[int, T]:
        """The staged rows, now counted as uploaded."""
        staged, self._staged = self._staged, {}
        for row, (_, has_content) in staged.items():
            if has_content:
                self._filled.add(row)
            else:
                self._filled.discard(row)
        return {row: content for row, (content, _) in staged.items()}

    @property
    def any_filled(self) -> bool:
        return bool(self._filled)
