"""Every option of the services' config dataclasses reaches the service that `sluice serve` starts: serve is given a
value other than the default for each, and each service reports the settings it was started with, in the flags' own
vocabulary. Two deployments between them set every option: speculative decoding needs an unsharded worker (no
tensor or pipeline parallelism)."""
import re
import subprocess
import tempfile
import time
from dataclasses import fields
from pathlib import Path

import pytest

from sluice.cli.launcher import free_port, free_ports, stop_services
from sluice.cli.python_command import sluice_command
from sluice.core.options import as_flags, option_fields
from sluice.router.config import RouterConfig
from sluice.scheduler.config import SchedulerConfig
from sluice.serving.operations import Operations
from sluice.worker.config import WorkerConfig

pytestmark = pytest.mark.slow

TENSOR_PARALLEL_SIZE = PIPELINE_PARALLEL_SIZE = 2
SHARDING = ("tensor_parallel_size", "pipeline_parallel_size", "pp_layer_partition")
WORKER = dict(model="SmolLM2-tiny", load_format="dummy", dtype="bfloat16", quantization="fp8", kv_cache_dtype="fp8",
              calculate_kv_scales=True, device="cpu:0", kv_cache_gib=0.25, gpu_memory_utilization=0.5,
              enforce_eager=True, dependent_launch=False, kernels="torch", tensor_parallel_size=TENSOR_PARALLEL_SIZE,
              pipeline_parallel_size=PIPELINE_PARALLEL_SIZE, pp_layer_partition="1,1",
              enable_expert_parallel=True, dist_timeout=30.0, draft_model="SmolLM2-tiny", draft_load_format="dummy",
              cpu_reserved_cores=0, kv_role="prefill",
              compile_cache=str(Path(tempfile.gettempdir()) / "sluice-serve-options-compile-cache"))
SCHEDULER = dict(num_blocks=64, block_size=32, max_num_seqs=8, max_num_batched_tokens=1024, max_model_len=512,
                 enable_prefix_caching=False, policy="fcfs", max_waiting_requests=16, max_waiting_tokens=100_000,
                 speculative_method="ngram", num_speculative_tokens=2, ngram_min=1, ngram_max=3,
                 step_timeout=30.0, max_num_encoder_input_tokens=4096, encoder_cache_size=4096, kv_role="prefill",
                 kv_lease_timeout=5.0, kv_pull_timeout=5.0)
ROUTER = dict(max_request_bytes=1 << 20, max_images_per_request=4, max_image_pixels=512 * 512,
              max_image_bytes_per_request=1 << 22)
OPERATIONS = dict(drain_timeout=5.0, metrics_host="127.0.0.1")  # and --metrics-port, one port per service
SETTINGS = {WorkerConfig: WORKER, SchedulerConfig: SCHEDULER, RouterConfig: ROUTER, Operations: OPERATIONS}
_REPORT = re.compile(r"(worker|scheduler|router) (settings|operations): (.*)$")


@pytest.mark.parametrize("config_type", SETTINGS, ids=lambda config_type: config_type.__name__)
def test_every_option_has_a_value_other_than_its_default(config_type):
    values = {**SETTINGS[config_type], **({"metrics_port": 1} if config_type is Operations else {})}
    assert sorted(values) == sorted(f.name for f in option_fields(config_type))
    defaults = {f.name: f.default for f in fields(config_type)}
    assert [name for name, value in values.items() if value == defaults[name]] == []


@pytest.mark.parametrize("left_default", [("speculative_method",), SHARDING], ids=["speculative_method", "sharding"])
def test_serve_hands_every_option_to_its_service(left_default):
    worker = {name: value for name, value in WORKER.items() if name not in left_default}
    scheduler = {name: value for name, value in SCHEDULER.items() if name not in left_default}
    ranks = worker.get("tensor_parallel_size", 1) * worker.get("pipeline_parallel_size", 1)
    metrics_port = free_ports(1, run=2 + ranks)[0]
    settings = {WorkerConfig: worker, SchedulerConfig: scheduler, RouterConfig: ROUTER, Operations: OPERATIONS}
    flags = [flag for config_type, values in settings.items() for flag in as_flags(values, config_type)]
    serve = subprocess.Popen([*sluice_command("serve"), "--port", str(free_port()), "--metrics-port", str(metrics_port),
                              *flags], stderr=subprocess.PIPE, text=True)
    try:
        reports = _reports(serve, expected=2 * (2 + ranks))
    finally:
        stop_services([serve])
    assert reports["worker settings"] == [_reported(WorkerConfig, worker)] * ranks
    assert reports["scheduler settings"] == [_reported(SchedulerConfig, scheduler)]
    assert reports["router settings"] == [_reported(RouterConfig, ROUTER)]
    offsets = {"router": [0], "scheduler": [1], "worker": [2 + rank for rank in range(ranks)]}
    for service, service_offsets in offsets.items():
        expected = [as_flags({**OPERATIONS, "metrics_port": metrics_port + offset}, Operations)
                    for offset in service_offsets]
        assert sorted(reports[f"{service} operations"]) == sorted(expected)


def _reported(config_type, values: dict) -> list[str]:
    """What a service reports when values set some of config_type's options: those, and the defaults of the rest, as
    the report's words (an empty default leaves none)."""
    flags = as_flags({**{f.name: f.default for f in option_fields(config_type)}, **values}, config_type)
    return " ".join(flags).split()


def _reports(serve: subprocess.Popen, expected: int, timeout: float = 120.0) -> dict[str, list[list[str]]]:
    """The settings and operations lines of the services that serve started, once `expected` of them are in."""
    reports: dict[str, list[list[str]]] = {}
    deadline = time.monotonic() + timeout
    while sum(map(len, reports.values())) < expected:
        assert time.monotonic() < deadline, f"only {reports} reported"
        line = serve.stderr.readline()
        assert line, f"serve ended; only {reports} reported"
        if match := _REPORT.search(line.rstrip("\n")):
            service, kind, flags = match.groups()
            reports.setdefault(f"{service} {kind}", []).append(flags.split())
    return reports
