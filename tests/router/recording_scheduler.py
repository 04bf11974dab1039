"""A scheduler stand-in on loopback that records the Submits a real router sends it and finishes each request at
once with no output (what reaches the scheduler, without a worker), and a real router process over it."""
import subprocess
import threading
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sluice.cli.launcher import free_port, stop_services, wait_until_serving
from sluice.cli.python_command import sluice_command
from sluice.serving.grpc_options import server_options
from sluice.v1 import generation_pb2, scheduler_pb2, scheduler_pb2_grpc

SCHEDULER_SERVICE = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name


class RecordingScheduler(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, model_info: generation_pb2.ModelInfo):
        self.model_info = model_info
        self.submits: dict[str, scheduler_pb2.Submit] = {}
        self._lock = threading.Lock()

    def Connect(self, request_iterator, context):
        for message in request_iterator:
            if message.WhichOneof("kind") != "submit":
                continue
            submit = message.submit
            with self._lock:
                self.submits[submit.request_id] = submit
            usage = generation_pb2.Usage(prompt_tokens=len(submit.prompt_token_ids))
            finished = scheduler_pb2.Finished(request_id=submit.request_id, reason=generation_pb2.FINISH_REASON_STOP,
                                              usage=usage)
            yield scheduler_pb2.SchedulerMessage(step=scheduler_pb2.StepUpdate(finished=[finished]))

    def GetModelInfo(self, request, context) -> generation_pb2.ModelInfo:
        return self.model_info

    def GetLoad(self, request, context) -> scheduler_pb2.Load:
        return scheduler_pb2.Load()


@contextmanager
def recording_scheduler(model_info: generation_pb2.ModelInfo):
    """(the scheduler, its address)."""
    scheduler = RecordingScheduler(model_info)
    server = grpc.server(futures.ThreadPoolExecutor(8), options=server_options())
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler, server)
    health_servicer = health.HealthServicer()
    health_servicer.set(SCHEDULER_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    address = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(address)
    server.start()
    try:
        yield scheduler, address
    finally:
        server.stop(0)


@contextmanager
def router_over(scheduler_address: str, model: Path, flags: list[str] = ()):
    """A real router process for the model folder, in front of the scheduler; its address."""
    address = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen([*sluice_command("router"), "--listen", address, "--scheduler", scheduler_address,
                                "--model", str(model), *flags])
    try:
        wait_until_serving(address, "sluice.v1.Generation", 120, [process])
        yield address
    finally:
        stop_services([process])
