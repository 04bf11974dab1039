"""`sluice serve --openai-port`: smg (the optional `gateway` extra) in front of the router, speaking the OpenAI and
Anthropic APIs over HTTP and vLLM's engine protocol to the router."""
import importlib.util
import json
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sluice.cli.python_command import python_command

_POLL_SECONDS = 0.2
MISSING = "--openai-port needs smg, the gateway: pip install 'sluice[gateway]'"


@dataclass(slots=True)
class GatewayLayout:
    host: str
    port: int  # the OpenAI API's
    metrics_port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def gateway_command(layout: GatewayLayout, router_addresses: list[str], model_path: Path,
                    extra_args: list[str] = (), prefill_router_addresses: list[str] = ()) -> list[str]:
    """smg's command line; SystemExit naming the extra to install where smg is missing. With
    prefill_router_addresses, smg runs in its PD mode: each request's prefill leg goes to a router of prefill
    replicas, its decode leg to one of router_addresses (routers of decode replicas)."""
    if importlib.util.find_spec("smg") is None:
        raise SystemExit(MISSING)
    return [*python_command("-m", "smg", "launch"), "--backend", "vllm",
            *_workers(router_addresses, prefill_router_addresses), "--model-path", str(model_path), "--host", layout.host, "--port", str(layout.port),
            "--prometheus-host", layout.host, "--prometheus-port", str(layout.metrics_port), *extra_args]


def _workers(router_addresses: list[str], prefill_router_addresses: list[str]) -> list[str]:
    if not prefill_router_addresses:
        return ["--worker-urls", *(f"grpc://{address}" for address in router_addresses)]
    return ["--pd-disaggregation", *(flag for address in prefill_router_addresses
                                     for flag in ("--prefill", f"grpc://{address}")),
            *(flag for address in router_addresses for flag in ("--decode", f"grpc://{address}"))]


def start_gateway(layout: GatewayLayout, router_addresses: list[str], model_path: Path, extra_args: list[str] = (),
                  env: dict[str, str] | None = None, prefill_router_addresses: list[str] = ()) -> subprocess.Popen:
    return subprocess.Popen(gateway_command(layout, router_addresses, model_path, extra_args,
                                            prefill_router_addresses), env=env)


def wait_until_gateway_serves(layout: GatewayLayout, timeout: float, process: subprocess.Popen) -> None:
    """Until the gateway completes a one-token request: it has taken the router on as a worker and registered the
    model's tokenizer (it lists the model a moment before it can serve it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the gateway exited with code {process.returncode}")
        try:
            models = json.loads(_http(f"{layout.url}/v1/models"))["data"]
            if models:
                _http(f"{layout.url}/v1/completions", {"model": models[0]["id"], "prompt": "hi", "max_tokens": 1})
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):  # HTTPError (a 503 while it starts) included
            pass
        time.sleep(_POLL_SECONDS)
    raise TimeoutError(f"the gateway at {layout.url} not serving after {timeout:.0f} s")


def _http(url: str, body: dict | None = None) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.read()
