"""The CPU install (`pip install 'sluice[model]'`, as the Dockerfile's image) has no triton: `sluice serve` must still
start every service and generate on the CPU, token for token as Hugging Face does."""
import os
import signal
import subprocess
import sys

import pytest

from sluice.cli.launcher import free_port, wait_until_serving
from sluice.cli.python_command import sluice_command
from sluice.client import SluiceClient
from sluice.v1 import generation_pb2 as pb

MAX_NEW_TOKENS = 12


@pytest.fixture
def env_without_triton(tmp_path) -> dict[str, str]:
    (tmp_path / "triton.py").write_text('raise ImportError("No module named \'triton\'")\n')
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    blocked = subprocess.run([sys.executable, "-c", "import triton"], env=env, capture_output=True)
    assert blocked.returncode != 0, "triton is still importable"
    return env


@pytest.mark.slow
def test_sluice_serve_generates_on_the_cpu_without_triton(env_without_triton, default_model_dir, hf_greedy_of,
                                                          hf_tokenizer):
    port = free_port()
    serve = subprocess.Popen([*sluice_command(), "serve", "--port", str(port),
                              "--model", str(default_model_dir)], env=env_without_triton)
    try:
        wait_until_serving(f"127.0.0.1:{port}", "sluice.v1.Generation", 300, [serve])
        prompt_ids = hf_tokenizer("The capital of France is").input_ids
        request = pb.GenerateRequest(tokens=pb.TokenIds(ids=prompt_ids),
                                     sampling=pb.SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0))
        with SluiceClient(f"127.0.0.1:{port}") as client:
            assert client.generate(request).token_ids == hf_greedy_of(prompt_ids, MAX_NEW_TOKENS)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(30)
    assert serve.returncode == 0
