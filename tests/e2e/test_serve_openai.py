"""`sluice serve --openai-port` puts smg in front of the router: the OpenAI API answers there, and Ctrl-C stops the
gateway and all three services."""
import signal
import subprocess

import openai
import psutil
import pytest

from sluice.cli.gateway import GatewayLayout, wait_until_gateway_serves
from sluice.cli.launcher import free_ports, stop_services
from sluice.cli.python_command import sluice_command

pytestmark = pytest.mark.slow


def _ctrl_c_as_in_a_terminal() -> None:
    """A test run in the background inherits SIGINT ignored, which Python would keep; a terminal's serve hears it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("router_processes", [1, 2])
def test_serve_with_an_openai_port_answers_there_and_ctrl_c_stops_everything(default_model_dir, router_processes):
    """With several router processes the gateway takes each as a worker of its own."""
    router_port, openai_port, openai_metrics_port = free_ports(3)
    gateway = GatewayLayout("127.0.0.1", openai_port, openai_metrics_port)
    serve = subprocess.Popen([*sluice_command(), "serve", "--model", str(default_model_dir),
                              "--port", str(router_port), "--openai-port", str(gateway.port),
                              "--openai-metrics-port", str(gateway.metrics_port), "--drain-timeout", "2",
                              "--router-processes", str(router_processes)],
                             preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        wait_until_gateway_serves(gateway, 300, serve)
        children = psutil.Process(serve.pid).children()
        assert len(children) == 3 + router_processes
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as client:
            stream = client.chat.completions.create(
                model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "What is the capital of France?"}],
                max_tokens=12, temperature=0, stream=True)
            assert "Paris" in "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=60) == 0
        _, alive = psutil.wait_procs(children, timeout=10)
        assert alive == []
    finally:
        stop_services([serve])
