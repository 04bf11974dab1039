"""The Python client shared by the CLI and the tests."""
import mimetypes
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from sluice.core.finish_reason_pb import finish_reason_from_pb
from sluice.serving.grpc_options import CHANNEL_OPTIONS
from sluice.v1 import generation_pb2 as pb
from sluice.v1 import generation_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    token: str
    logprob: float
    rank: int  # 1 = the most likely
    top: list[tuple[int, str, float]]  # the most likely alternatives: (token id, text, logprob), best first


@dataclass(slots=True)
class Generation:
    """One sample of a generation."""

    request_id: str = ""
    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    time_to_first_token_seconds: float = 0.0
    logprobs: list[TokenLogprob] = field(default_factory=list)  # when sampling.logprobs is set
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # prompt tokens 1.., when asked

    def to_json(self) -> dict:
        out = {"request_id": self.request_id, "index": self.index, "text": self.text, "token_ids": self.token_ids,
               "finish_reason": self.finish_reason, "usage": self.usage}
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name):
                out[name] = [asdict(entry) for entry in getattr(self, name)]
        return out


class SluiceClient:
    def __init__(self, address: str, auth_token: str | None = None, root_certificates: bytes | None = None):
        """root_certificates: PEM roots for a TLS router (None: plaintext); auth_token: sent as a bearer token."""
        if root_certificates is None:
            self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        else:
            credentials = grpc.ssl_channel_credentials(root_certificates)
            self.channel = grpc.secure_channel(address, credentials, options=CHANNEL_OPTIONS)
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)
        self.metadata = [("authorization", f"Bearer {auth_token}")] if auth_token else []

    def stream(self, request: pb.GenerateRequest, timeout: float | None = None) -> Iterator[pb.GenerateResponse]:
        return self.stub.Generate(request, timeout=timeout, metadata=self.metadata)

    def generate(self, request: pb.GenerateRequest, timeout: float | None = None, on_text=None) -> Generation:
        """A request for one sample; on_text gets each text delta as it streams."""
        if request.sampling.n > 1:
            raise ValueError("this request asks for several samples: use generate_samples")
        by_index = None if on_text is None else lambda index, text: on_text(text)
        return self.generate_samples(request, timeout, by_index)[0]

    def generate_samples(self, request: pb.GenerateRequest, timeout: float | None = None,
                         on_text=None) -> list[Generation]:
        """Every sample of the request, by index; on_text gets (index, text delta) as they stream."""
        request.return_token_ids = True
        samples: dict[int, Generation] = {}
        for response in self.stream(request, timeout):
            message = response.chunk if response.HasField("chunk") else response.complete
            result = samples.setdefault(message.index, Generation(response.request_id, message.index))
            if response.HasField("chunk"):
                _add_chunk(result, response.chunk)
                if on_text is not None:
                    on_text(message.index, response.chunk.text)
            else:
                _add_complete(result, response.complete)
        return [samples[index] for index in sorted(samples)]

    def abort(self, request_id: str) -> bool:
        return self.stub.Abort(pb.AbortRequest(request_id=request_id), metadata=self.metadata).found

    def model_info(self) -> pb.ModelInfo:
        return self.stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=self.metadata)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "SluiceClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def scheduler_load(address: str, timeout: float = 5.0) -> scheduler_pb2.Load:
    """A scheduler's GetLoad (queue, KV blocks, speculative decoding's counts), from its own port."""
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        return scheduler_pb2_grpc.SchedulerStub(channel).GetLoad(scheduler_pb2.GetLoadRequest(), timeout=timeout)


def _add_chunk(result: Generation, chunk: pb.Chunk) -> None:
    result.text += chunk.text
    result.token_ids.extend(chunk.token_ids)
    result.logprobs += token_logprobs(chunk.logprobs)
    result.prompt_logprobs += token_logprobs(chunk.prompt_logprobs)


def _add_complete(result: Generation, complete: pb.Complete) -> None:
    result.finish_reason = finish_reason_from_pb(complete.finish_reason).value
    result.usage = {"prompt_tokens": complete.usage.prompt_tokens,
                    "completion_tokens": complete.usage.completion_tokens,
                    "cached_tokens": complete.usage.cached_tokens}
    result.time_to_first_token_seconds = complete.timings.time_to_first_token_seconds


def token_logprobs(message: pb.Logprobs) -> list[TokenLogprob]:
    """Unpacks the packed Logprobs message, one entry per token."""
    k = message.num_top
    return [
        TokenLogprob(token_id, message.tokens[i], message.logprobs[i], message.ranks[i],
                     list(zip(message.top_token_ids[i * k:(i + 1) * k], message.top_tokens[i * k:(i + 1) * k],
                              message.top_logprobs[i * k:(i + 1) * k])))
        for i, token_id in enumerate(message.token_ids)
    ]


def sampling_params(**values) -> pb.SamplingParams:
    """pb.SamplingParams from keyword arguments; `choice` may be a plain list of strings, `bad_words_token_ids` a list
    of lists of ids."""
    if "choice" in values:
        values["choice"] = pb.Choice(values=values["choice"])
    if "bad_words_token_ids" in values:
        values["bad_words_token_ids"] = [pb.TokenIds(ids=ids) for ids in values["bad_words_token_ids"]]
    return pb.SamplingParams(**values)


def text_request(text: str, **sampling) -> pb.GenerateRequest:
    return pb.GenerateRequest(text=text, sampling=sampling_params(**sampling))


def chat_request(content: str, images: Sequence[bytes | Path] = (), **sampling) -> pb.GenerateRequest:
    """One user message: the images (encoded, or their files), then the text."""
    return pb.GenerateRequest(chat=pb.ChatMessages(messages=[user_message(content, images)]),
                              sampling=sampling_params(**sampling))


def user_message(content: str, images: Sequence[bytes | Path] = ()) -> pb.ChatMessage:
    """The images (encoded, or their files), then the text."""
    if images:
        return pb.ChatMessage(role="user", parts=[*map(image_part, images), pb.ContentPart(text=content)])
    return pb.ChatMessage(role="user", content=content)


def image_part(image: bytes | Path) -> pb.ContentPart:
    """An encoded image as a part of a chat message; a file's media type is guessed from its name."""
    if isinstance(image, Path):
        return pb.ContentPart(image=pb.Image(data=image.read_bytes(), media_type=mimetypes.guess_type(image)[0] or ""))
    return pb.ContentPart(image=pb.Image(data=image))
