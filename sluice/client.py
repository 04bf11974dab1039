"""The Python client shared by the CLI and the tests."""
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc

from sluice.grpc_options import CHANNEL_OPTIONS
from sluice.v1 import generation_pb2 as pb
from sluice.v1 import generation_pb2_grpc

FINISH_REASONS = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length", pb.FINISH_REASON_ABORT: "abort"}


@dataclass(slots=True)
class Generation:
    request_id: str = ""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    time_to_first_token_seconds: float = 0.0

    def to_json(self) -> dict:
        return {"request_id": self.request_id, "text": self.text, "token_ids": self.token_ids,
                "finish_reason": self.finish_reason, "usage": self.usage}


class SluiceClient:
    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)

    def stream(self, request: pb.GenerateRequest, timeout: float | None = None) -> Iterator[pb.GenerateResponse]:
        return self.stub.Generate(request, timeout=timeout)

    def generate(self, request: pb.GenerateRequest, timeout: float | None = None, on_text=None) -> Generation:
        request.return_token_ids = True
        result = Generation()
        for response in self.stream(request, timeout):
            result.request_id = response.request_id
            if response.HasField("chunk"):
                result.text += response.chunk.text
                result.token_ids.extend(response.chunk.token_ids)
                if on_text is not None:
                    on_text(response.chunk.text)
            else:
                complete = response.complete
                result.finish_reason = FINISH_REASONS.get(complete.finish_reason)
                result.usage = {"prompt_tokens": complete.usage.prompt_tokens,
                                "completion_tokens": complete.usage.completion_tokens,
                                "cached_tokens": complete.usage.cached_tokens}
                result.time_to_first_token_seconds = complete.timings.time_to_first_token_seconds
        return result

    def abort(self, request_id: str) -> bool:
        return self.stub.Abort(pb.AbortRequest(request_id=request_id)).found

    def model_info(self) -> pb.ModelInfo:
        return self.stub.GetModelInfo(pb.GetModelInfoRequest())

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "SluiceClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def text_request(text: str, **sampling) -> pb.GenerateRequest:
    return pb.GenerateRequest(text=text, sampling=pb.SamplingParams(**sampling))


def chat_request(content: str, **sampling) -> pb.GenerateRequest:
    messages = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=content)])
    return pb.GenerateRequest(chat=messages, sampling=pb.SamplingParams(**sampling))
