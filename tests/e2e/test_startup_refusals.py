"""A worker given what no module computes stops at start, naming it: an unsupported architecture, a config option
that is not implemented, a weight the model does not expect."""
import subprocess

import pytest
import torch

from sluice.cli.launcher import free_port
from sluice.cli.python_command import sluice_command
from tests.worker.test_model_families import _TINY, FAMILIES
from tests.worker.test_moe_families import lively_state


def _folder(tmp_path, hf_config: dict, extra_weights: dict | None = None):
    from safetensors.torch import save_file
    from transformers import AutoConfig

    AutoConfig.for_model(**hf_config).save_pretrained(tmp_path)
    save_file({**lively_state({**_TINY, **FAMILIES["llama"]}), **(extra_weights or {})},
              tmp_path / "model.safetensors")
    return tmp_path


def _start_worker(folder) -> str:
    result = subprocess.run(sluice_command("worker", "--model", str(folder), "--listen", f"127.0.0.1:{free_port()}"),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    return result.stderr


@pytest.mark.parametrize("hf_config, extra_weights, message", [
    ({**_TINY, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}, None,
     "unsupported architecture 'DeepseekV3ForCausalLM'; supported: ["),
    ({**_TINY, **FAMILIES["llama"], "attention_bias": True}, None,
     "LlamaForCausalLM: config.json sets attention_bias = True, which the worker does not implement; it supports "
     "false (biased attention projections)"),
    ({**_TINY, **FAMILIES["llama"]}, {"model.layers.0.self_attn.sinks": torch.zeros(4)},
     "the LlamaForCausalLM checkpoint does not match the worker's LlamaForCausalLM model; weights the worker does "
     "not expect: layers.0.self_attn.sinks (supported architectures: ["),
], ids=["architecture", "config-option", "weight"])
def test_the_worker_refuses_at_start_naming_what_is_missing(tmp_path, hf_config, extra_weights, message):
    stderr = _start_worker(_folder(tmp_path, hf_config, extra_weights))
    assert message in stderr
    if message.endswith("["):  # the supported list follows
        assert "'MistralForCausalLM'" in stderr.split(message)[-1].split("]")[0]
