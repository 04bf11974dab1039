"""Stop strings across token boundaries: text that may start one waits for the next delta."""
class StopStringMatcher:
    """Finds the first stop string in streamed text, across deltas (and so across token boundaries). Text that could
    be the start of a stop string is held back until the next delta tells whether it is one."""

    def __init__(self, stop: list[str], include_in_output: bool):
        self.stop = stop
        self.include_in_output = include_in_output
        self.matched: str | None = None
        self._held = ""

    def push(self, text: str) -> str:
        """The text that is safe to emit now. On a match: the text up to the stop string (and the stop string if
        include_in_output), and nothing after that."""
        if self.matched is not None:
            return ""
        text = self._held + text
        hits = [(index, order, stop) for order, stop in enumerate(self.stop) if (index := text.find(stop)) >= 0]
        if hits:
            index, _, self.matched = min(hits)
            self._held = ""
            return text[:index + len(self.matched) if self.include_in_output else index]
        num_held = max((k for stop in self.stop for k in range(1, min(len(stop), len(text) + 1))
                        if text.endswith(stop[:k])), default=0)
        self._held = text[len(text) - num_held:]
        return text[:len(text) - num_held]

    def flush(self) -> str:
        """The held-back text, once no more text will come."""
        text, self._held = self._held, ""
        return text
