"""sluice.v1.Scheduler's servicer: each router's stream of submissions and step updates, load, model info, KV events."""
import asyncio

from sluice.core.errors import SluiceError, Unimplemented
from sluice.core.finish_reason import FinishReason
from sluice.core.finish_reason_pb import finish_reason_from_pb
from sluice.core.kv_transfer_pb import kv_source_to_pb
from sluice.scheduler.engine_loop import EngineLoop
from sluice.scheduler.routers.kv_event_stream import kv_event_stream
from sluice.scheduler.routers.outbox import Outbox
from sluice.scheduler.routers.sessions import RouterSessions
from sluice.scheduler.routers.updates_pb import load_to_pb, loaded_batch_to_pb, request_from_pb
from sluice.v1 import generation_pb2, scheduler_pb2, scheduler_pb2_grpc


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, loop: EngineLoop, sessions: RouterSessions, model_info: generation_pb2.ModelInfo):
        self.loop = loop
        self.sessions = sessions
        self.model_info = model_info

    async def Connect(self, request_iterator, context):
        outbox = self.sessions.open()
        reader = asyncio.create_task(self._read(request_iterator, outbox))
        try:
            while True:
                yield await outbox.get()
        finally:
            reader.cancel()
            for request_id in self.sessions.close(outbox):
                self.loop.finish(request_id, FinishReason.ABORT)

    async def _read(self, request_iterator, outbox: Outbox) -> None:
        async for message in request_iterator:
            kind = message.WhichOneof("kind")
            if kind == "submit":
                self._submit(message.submit, outbox)
            elif kind == "credit":
                outbox.grant(message.credit.messages)
            elif kind == "finish" and self.sessions.owns(outbox, message.finish.request_id):
                finish = message.finish
                self.loop.finish(finish.request_id, finish_reason_from_pb(finish.reason),
                                 finish.index if finish.HasField("index") else None)

    def _submit(self, submit: scheduler_pb2.Submit, outbox: Outbox) -> None:
        try:
            self.loop.submit(request_from_pb(submit), outbox, submit.trace_context)
        except SluiceError as error:
            self.sessions.reject(outbox, [submit.request_id], error)

    async def GetLoad(self, request, context) -> scheduler_pb2.Load:
        return load_to_pb(self.loop.scheduler.get_load())

    async def GetModelInfo(self, request, context) -> generation_pb2.ModelInfo:
        return self.model_info

    async def GetKvSources(self, request, context) -> scheduler_pb2.KvSources:
        if self.loop.scheduler.config.kv_role != "prefill":
            raise Unimplemented(f"this replica's kv_role is {self.loop.scheduler.config.kv_role!r}, not 'prefill'")
        worker = self.loop.worker
        return scheduler_pb2.KvSources(engine_id=worker.kv_engine_id,
                                       ranks=[kv_source_to_pb(source) for source in worker.kv_sources])

    async def ReleaseKv(self, request: scheduler_pb2.ReleaseKvRequest, context) -> scheduler_pb2.ReleaseKvResponse:
        return scheduler_pb2.ReleaseKvResponse(found=self.loop.release_lease(request.request_id))

    async def SubscribeKvEvents(self, request: scheduler_pb2.SubscribeKvEventsRequest, context):
        log = self.loop.kv_events
        log.check_cursor(request.after_sequence_number)
        await context.send_initial_metadata(())  # the subscriber learns its cursor is taken before any batch
        async for loaded in kv_event_stream(log, self.loop.scheduler.get_load, request.after_sequence_number,
                                            request.load_only_batches, request.load_before_first_batch):
            yield loaded_batch_to_pb(loaded)
