"""Why a request ended (FinishReason), shared by all three services."""
import enum


class FinishReason(enum.Enum):
    STOP = "stop"  # EOS, a stop token id, or a stop string the router matched
    LENGTH = "length"  # max_tokens or max_model_len reached
    ABORT = "abort"  # cancelled by the client or the router
    DEADLINE = "deadline"  # the request's deadline passed
    ERROR = "error"  # the request cannot go on: its structured output reached text no token continues

    @property
    def reported(self) -> str:
        """The name clients, spans and metrics see (OpenAI's): a passed deadline or an error reads as an abort."""
        return FinishReason.ABORT.value if self in (FinishReason.DEADLINE, FinishReason.ERROR) else self.value
