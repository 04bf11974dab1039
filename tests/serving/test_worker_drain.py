"""On shutdown, a worker waits for the requests it holds while their scheduler streams steps, and not once that
stream has ended: a scheduler stopped right after a request ended may never tell the worker that it had."""
import asyncio
import logging
from types import SimpleNamespace

import grpc
import torch
from grpc_health.v1 import health_pb2

from sluice.cli.launcher import free_port
from sluice.core.step_plan import StepOutcome, StepPlan
from sluice.core.step_plan_pb import plan_to_pb
from sluice.serving.operations import Operations
from sluice.v1 import worker_pb2_grpc
from tests.serving.test_readiness_order import _wait_for_status

DRAIN_TIMEOUT = 30.0


def _engine_holding_a_request() -> SimpleNamespace:
    """Runs empty steps; holds one request whose end its scheduler never sent."""
    return SimpleNamespace(num_live_requests=1, device=torch.device("cpu"), group=None,
                           launch=lambda plan: SimpleNamespace(ready=lambda: True, step_id=plan.step_id, arriving=None,
                                                               encoder_span=None),
                           finish=lambda step: StepOutcome(step.step_id, {}))


async def _one_step_then_none():
    yield plan_to_pb(StepPlan(step_id=0))
    await asyncio.Event().wait()


def test_drain_waits_for_held_requests_until_their_scheduler_stream_ends(monkeypatch, caplog):
    from sluice.worker import server
    from sluice.worker.config import WorkerConfig

    monkeypatch.setattr(server.WorkerEngine, "load", lambda config, group=None: _engine_holding_a_request())
    address = f"127.0.0.1:{free_port()}"

    async def scenario():
        operations = Operations(drain_timeout=DRAIN_TIMEOUT)
        serving = asyncio.create_task(server.serve(WorkerConfig(model="unused"), address, operations))
        await _wait_for_status(address, "sluice.v1.Worker", health_pb2.HealthCheckResponse.SERVING)
        async with grpc.aio.insecure_channel(address) as channel:
            stream = worker_pb2_grpc.WorkerStub(channel).Execute(_one_step_then_none())
            assert (await stream.read()).step_id == 0
            operations.shutdown.set()
            await asyncio.sleep(0.5)
            assert not serving.done()
            stream.cancel()
            await asyncio.wait_for(serving, DRAIN_TIMEOUT / 3)

    with caplog.at_level(logging.INFO, logger="sluice.worker"):
        asyncio.run(scenario())
    assert "worker drained" in caplog.messages
