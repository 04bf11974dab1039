"""A Generation servicer with no model: Tokenize answers at once, Generate streams until released."""
import asyncio

from sluice.v1 import generation_pb2 as pb
from sluice.v1 import generation_pb2_grpc


class FakeGeneration(generation_pb2_grpc.GenerationServicer):
    def __init__(self):
        self.release = asyncio.Event()
        self.streaming = asyncio.Event()

    async def Tokenize(self, request, context):
        return pb.TokenizeResponse(token_ids=[1, 2, 3])

    async def Generate(self, request, context):
        yield pb.GenerateResponse(chunk=pb.Chunk(text="first"))
        self.streaming.set()
        await self.release.wait()
        yield pb.GenerateResponse(complete=pb.Complete(finish_reason=pb.FINISH_REASON_STOP))
