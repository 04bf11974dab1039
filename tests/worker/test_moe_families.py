"""The mixtures of experts (Qwen3-MoE, Qwen2-MoE with its shared expert, Mixtral, OLMoE with its whole-projection q/k
norms), at a tiny size with random weights and dense layers mixed in where the family has them: token-identical to
Hugging Face greedy on one device, and a rank group, sharding every expert's intermediate size or placing whole
experts on the ranks, gives the whole model's tokens."""
import weakref
from pathlib import Path

import pytest
import torch

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.dummy_weights import random_state_dict
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.weights import load_checkpoint, to_worker_layout
from sluice.worker.models.config import ModelConfig
from tests.worker.rank_group import run_on_ranks
from tests.worker.stepping import run_greedy

TINY_MOE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 512,
            "rms_norm_eps": 1e-6, "eos_token_id": 0, "pad_token_id": 255, "num_experts_per_tok": 2}
MOE_FAMILIES = {
    "qwen3-moe": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 8,
                  "moe_intermediate_size": 32, "norm_topk_prob": True, "mlp_only_layers": [1]},
    "qwen2-moe": {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_experts": 16,
                  "moe_intermediate_size": 24, "shared_expert_intermediate_size": 48, "decoder_sparse_step": 2},
    "mixtral": {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 8,
                "intermediate_size": 40, "sliding_window": None},
    "olmoe": {"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "num_experts": 16,
              "intermediate_size": 24, "num_experts_per_tok": 4, "clip_qkv": None},
}
PROMPTS = [[5, 17, 99, 3], [42] * 9, list(range(100, 123))]


def lively_state(hf_config: dict) -> dict[str, torch.Tensor]:
    """Random weights, scaled so that routing and outputs are far from ties."""
    state = random_state_dict(hf_config, torch.float32, torch.device("cpu"), seed=1)
    return {name: t if name.endswith("norm.weight") else t * 10 for name, t in state.items()}


def write_tiny_moe(folder: Path, family: str, **options) -> Path:
    """The family's tiny checkpoint (options change its config), as transformers saves it (experts one by one)."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    hf_config = {**TINY_MOE, **MOE_FAMILIES[family], **options}
    save_file(lively_state(hf_config), folder / "model.safetensors")
    AutoConfig.for_model(**hf_config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    return {family: write_tiny_moe(tmp_path_factory.mktemp(family), family) for family in MOE_FAMILIES}


def load_engine(folder, worker_config: WorkerConfig, group=None) -> WorkerEngine:
    """The folder's model alone, or the rank's part of it in group."""
    rank, world_size = (0, 1) if group is None else (group.rank, group.world_size)
    checkpoint = load_checkpoint(folder, rank, world_size, worker_config.enable_expert_parallel)
    return WorkerEngine(worker_config, ModelLoader(worker_config, group).build(*checkpoint), group)


@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_moe_family_matches_hf(family, checkpoints):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(checkpoints[family], dtype=torch.float32).eval()
    expected = [hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
    for batch in (PROMPTS, PROMPTS[2:]):
        engine = load_engine(checkpoints[family], WorkerConfig(model=family))
        assert run_greedy(engine, batch, 12, chunk=5) == expected[len(PROMPTS) - len(batch):]


def test_dense_and_sparse_layers_are_read_as_each_family_places_them(checkpoints):
    sparse = {family: load_checkpoint(folder)[0].moe.sparse_layers for family, folder in checkpoints.items()}
    assert sparse == {"qwen3-moe": (0, 2), "qwen2-moe": (1,), "mixtral": (0, 1, 2), "olmoe": (0, 1, 2)}


def test_experts_are_freed_as_they_are_stacked():
    """A checkpoint's per-expert tensors go once stacked: a 30B mixture's experts never sit in memory twice."""
    hf_config = {**TINY_MOE, **MOE_FAMILIES["qwen3-moe"]}
    hf_state = random_state_dict(hf_config, torch.float32, torch.device("cpu"), seed=0)
    experts = [weakref.ref(tensor) for name, tensor in hf_state.items() if ".experts." in name]
    state = to_worker_layout(hf_state, ModelConfig.from_hf(hf_config))
    assert state["layers.0.mlp.experts.w13"].shape == (8, 64, 64) and len(experts) == 2 * 8 * 3
    assert not hf_state and all(expert() is None for expert in experts)


def _check_sharded_rank(group, checkpoints: dict, expert_parallel: bool) -> None:
    for family, folder in sorted(checkpoints.items()):
        whole = load_engine(folder, WorkerConfig(model=family))
        sharded = load_engine(folder, WorkerConfig(model=family, enable_expert_parallel=expert_parallel), group)
        moe = whole.model_config.moe
        experts = sharded.model.layers[moe.sparse_layers[0]].mlp.experts
        assert experts.w13.shape[0] == moe.num_experts // (2 if expert_parallel else 1)
        expected = run_greedy(whole, PROMPTS, 8, chunk=5)
        got = run_greedy(sharded, PROMPTS, 8, chunk=5)
        assert got == (expected if group.is_driver else [[]] * len(PROMPTS)), family


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["expert-columns", "expert-parallel"])
def test_sharded_moe_matches_the_whole_model(checkpoints, expert_parallel):
    run_on_ranks(_check_sharded_rank, 2, checkpoints, expert_parallel)
