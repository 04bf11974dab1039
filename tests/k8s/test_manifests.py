"""Every manifest of k8s/ (the base and each overlay, rendered by the real kustomize) is valid against the Kubernetes
schemas and keeps the operational promises: native gRPC probes, drains that fit the grace period, headless Services,
OTel wiring, compiled kernels kept on a volume."""
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from sluice.cli.main import build_parser

K8S = Path(__file__).parents[2] / "k8s"
KUSTOMIZATIONS = {"base": K8S / "base", "cpu-demo": K8S / "overlays" / "cpu-demo", "gpu": K8S / "overlays" / "gpu",
                  "gateway": K8S / "overlays" / "gateway", "gpu-pipeline": K8S / "overlays" / "gpu-pipeline",
                  "gpu-shared-compile-cache": K8S / "overlays" / "gpu-shared-compile-cache", "pd": K8S / "overlays" / "pd"}
READINESS = {"router": "sluice.v1.Generation", "scheduler": "sluice.v1.Scheduler", "worker": "sluice.v1.Worker"}
CLOSE_SECONDS = 10  # a process's own stop after its drain: its server, its spans, a worker's ranks (5 s)


def _kustomize_command() -> list[str]:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    pytest.fail("rendering k8s/ needs kustomize or kubectl on the PATH")


def render(directory: Path) -> list[dict]:
    output = subprocess.run([*_kustomize_command(), str(directory)], check=True, capture_output=True, text=True).stdout
    return [document for document in yaml.safe_load_all(output) if document]


@pytest.fixture(scope="module", params=list(KUSTOMIZATIONS))
def rendered(request) -> list[dict]:
    return render(KUSTOMIZATIONS[request.param])


def _all_containers(documents: list[dict]):
    """Each container with its args as Kubernetes passes them: $(NAME) replaced by the container's variable NAME
    (one from the pod's index, as the first pod's)."""
    for document in documents:
        template = document.get("spec", {}).get("template")
        if document["kind"] in ("Deployment", "StatefulSet"):
            for container in template["spec"]["containers"]:
                yield template["spec"], {**container, "args": _expanded(container)}


def _expanded(container: dict) -> list[str]:
    values = {variable["name"]: variable.get("value", "0") for variable in container.get("env", [])}
    return [re.sub(r"\$\((\w+)\)", lambda name: values[name[1]], arg) for arg in container.get("args", [])]


def _containers(documents: list[dict]):
    """Sluice's own: the router, the scheduler and the worker."""
    return ((pod, container) for pod, container in _all_containers(documents) if container["name"] in READINESS)


def _option(args: list[str], name: str) -> str:
    parsed = build_parser().parse_args(args)
    return getattr(parsed, name)


def test_every_manifest_is_valid_against_the_kubernetes_schemas(rendered):
    version = kubernetes_validate.latest_version()
    for document in rendered:
        kubernetes_validate.validate(document, version, strict=True)


def test_container_args_are_real_sluice_options(rendered):
    for _, container in _containers(rendered):
        build_parser().parse_args(container["args"])


def _pre_stop_seconds(container: dict) -> float:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    return float(command[1])


def test_drain_fits_in_the_grace_period(rendered):
    for pod, container in _containers(rendered):
        drain_timeout = _option(container["args"], "drain_timeout")
        needed = _pre_stop_seconds(container) + drain_timeout + CLOSE_SECONDS
        assert pod["terminationGracePeriodSeconds"] >= needed, container["name"]


def test_each_tier_drains_at_least_as_long_as_the_tier_in_front_of_it(rendered):
    """Pods stop in no order: what a tier still holds must find the tiers behind it serving."""
    drain_timeouts = {container["name"]: _option(container["args"], "drain_timeout")
                      for _, container in _containers(rendered)}
    gateway = next((c for _, c in _all_containers(rendered) if c["name"] == "gateway"), None)
    if gateway is not None:
        from smg.launch_router import parse_router_args

        assert parse_router_args(gateway["args"]).shutdown_grace_period_secs <= drain_timeouts["router"]
    assert drain_timeouts["router"] <= drain_timeouts["scheduler"] <= drain_timeouts["worker"]


def test_probes_are_native_grpc_with_a_startup_probe_for_loading(rendered):
    for _, container in _containers(rendered):
        service = READINESS[container["name"]]
        port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
        assert container["startupProbe"]["grpc"] == {"port": port, "service": service}
        assert container["readinessProbe"]["grpc"] == {"port": port, "service": service}
        assert container["livenessProbe"]["grpc"] == {"port": port}
        assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] >= 600


def test_services_are_headless_and_every_container_exports_traces_and_metrics(rendered):
    services = [d for d in rendered if d["kind"] == "Service" and d["metadata"]["name"] != "sluice-gateway"]
    assert {s["metadata"]["name"] for s in services} in ({"sluice-router", "sluice-scheduler", "sluice-worker"},
                                                         {"sluice-router", "sluice-prefill", "sluice-decode"})
    assert all(s["spec"]["clusterIP"] == "None" for s in services)
    otel = next(d for d in rendered if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "sluice-otel")
    assert otel["data"]["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http")
    for _, container in _containers(rendered):
        assert {"configMapRef": {"name": "sluice-otel"}} in container["envFrom"]
        metrics_port = _option(container["args"], "metrics_port")
        assert {"name": "metrics", "containerPort": metrics_port} in container["ports"]


def test_router_scales_with_an_hpa_and_keeps_a_disruption_budget(rendered):
    kinds = {(d["kind"], d["metadata"]["name"]): d for d in rendered}
    hpa = kinds[("HorizontalPodAutoscaler", "sluice-router")]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "sluice-router"}
    pdb = kinds[("PodDisruptionBudget", "sluice-router")]
    assert pdb["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "sluice-router"}


def test_workers_get_shared_memory_and_the_gpu_overlay_asks_for_gpus():
    for name, directory in KUSTOMIZATIONS.items():
        pod, worker = next((p, c) for p, c in _containers(render(directory)) if c["name"] == "worker")
        shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"]["medium"] == "Memory"
        assert {"name": "dshm", "mountPath": "/dev/shm"} in worker["volumeMounts"]
        gpus = worker["resources"].get("limits", {}).get("nvidia.com/gpu")
        assert (gpus is not None) == name.startswith("gpu")
        assert (_option(worker["args"], "device") == "cuda") == name.startswith("gpu")
        if gpus is not None:  # one GPU per tensor-parallel rank, and the scheduler dials every rank
            _assert_gpus_and_ranks(render(directory), worker, gpus)


def _assert_gpus_and_ranks(documents: list[dict], worker: dict, gpus: int) -> None:
    """A pod per pipeline stage, with a GPU per tensor-parallel rank of it; the scheduler dials every rank in rank
    order; the stages' pods run their own stages (--pp-rank from the pod's index) and meet at the first pod."""
    tensor_parallel_size = _option(worker["args"], "tensor_parallel_size")
    pipeline_parallel_size = _option(worker["args"], "pipeline_parallel_size")
    assert gpus == tensor_parallel_size > 1
    workers = next(d for d in documents if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "sluice-worker")
    assert workers["spec"]["replicas"] == pipeline_parallel_size
    scheduler = next(c for _, c in _containers(documents) if c["name"] == "scheduler")
    ranks = _option(scheduler["args"], "worker").split(",")
    assert ranks == [f"sluice-worker-{stage}.sluice-worker:{50053 + rank}"
                     for stage in range(pipeline_parallel_size) for rank in range(gpus)]
    for rank in range(1, gpus):
        assert {"name": f"grpc-rank{rank}", "containerPort": 50053 + rank} in worker["ports"]
    if pipeline_parallel_size > 1:
        stage = next(v for v in worker["env"] if v["name"] == "PIPELINE_STAGE")
        assert stage["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
        assert "--pp-rank=$(PIPELINE_STAGE)" in next(c for c in workers["spec"]["template"]["spec"]["containers"]
                                                      if c["name"] == "worker")["args"]
        host, port = _option(worker["args"], "dist_init_address").rsplit(":", 1)
        assert host == "sluice-worker-0.sluice-worker" and workers["spec"]["serviceName"] == "sluice-worker"
        assert {"name": "dist", "containerPort": int(port)} in worker["ports"]


def test_workers_keep_compiled_kernels_on_a_volume_of_their_pod_or_on_a_shared_claim():
    for name, directory in KUSTOMIZATIONS.items():
        documents = render(directory)
        pod, worker = next((p, c) for p, c in _containers(documents) if c["name"] == "worker")
        folder = _option(worker["args"], "compile_cache")
        mount = next(m for m in worker["volumeMounts"] if m["mountPath"] == folder)
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        claims = [d for d in documents if d["kind"] == "PersistentVolumeClaim"]
        if name != "gpu-shared-compile-cache":
            assert set(volume) == {"name", "emptyDir"} and not claims
            continue
        assert [claim["metadata"]["name"] for claim in claims] == [volume["persistentVolumeClaim"]["claimName"]]
        assert set(volume) == {"name", "persistentVolumeClaim"}
        assert claims[0]["spec"]["accessModes"] == ["ReadWriteMany"]
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]



def test_the_gateway_overlay_puts_smg_in_front_of_the_router_service():
    from smg.launch_router import parse_router_args

    documents = render(KUSTOMIZATIONS["gateway"])
    pod, gateway = next((p, c) for p, c in _all_containers(documents) if c["name"] == "gateway")
    assert gateway["command"] == ["python3", "-m", "smg", "launch"]
    options = parse_router_args(gateway["args"])
    router = next(d for d in documents if d["kind"] == "Service" and d["metadata"]["name"] == "sluice-router")
    router_port = next(p["port"] for p in router["spec"]["ports"] if p["name"] == "grpc")
    assert options.worker_urls == [f"grpc://sluice-router:{router_port}"]
    assert options.backend == "vllm"
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert ports == {"http": options.port, "metrics": options.prometheus_port}
    assert pod["terminationGracePeriodSeconds"] >= \
        _pre_stop_seconds(gateway) + options.shutdown_grace_period_secs + CLOSE_SECONDS
    for probe, path in (("startupProbe", "/readiness"), ("readinessProbe", "/readiness"), ("livenessProbe", "/liveness")):
        assert gateway[probe]["httpGet"] == {"path": path, "port": "http"}
    service = next(d for d in documents if d["kind"] == "Service" and d["metadata"]["name"] == "sluice-gateway")
    assert service["spec"]["ports"] == [{"name": "http", "port": options.port, "targetPort": "http"}]


def test_the_pd_overlay_scales_prefill_and_decode_replicas_on_their_own_behind_the_router():
    documents = render(KUSTOMIZATIONS["pd"])
    kinds = {(d["kind"], d["metadata"]["name"]): d for d in documents}
    router = next(c for _, c in _containers(documents) if c["name"] == "router")
    sides = {"prefill": _option(router["args"], "prefill_scheduler"), "decode": _option(router["args"], "scheduler")}
    for role, address in sides.items():
        name = f"sluice-{role}"
        service = kinds[("Service", name)]
        assert address == f"{name}:{service['spec']['ports'][0]['port']}"
        deployment = kinds[("Deployment", name)]
        assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
        hpa = kinds[("HorizontalPodAutoscaler", name)]
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
        assert {_option(c["args"], "kv_role") for c in containers.values()} == {role}
        worker_port = _option(containers["worker"]["args"], "listen").rsplit(":", 1)[1]
        assert _option(containers["scheduler"]["args"], "worker") == f"127.0.0.1:{worker_port}"
    assert not any(kind in (("Deployment", "sluice-scheduler"), ("StatefulSet", "sluice-worker")) for kind in kinds)
