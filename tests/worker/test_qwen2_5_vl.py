"""Qwen2.5-VL against transformers' Qwen2_5_VLForConditionalGeneration (the same weights, read from the folder
transformers saves): prompts with 0, 1 and 2 images prefilled with their image embeddings at the placeholders, greedy
decoding after them at the prompt's position delta, text prompts through the engine's step path; tensor-parallel
ranks against the whole model; checkpoint names either way; random weights of the published shapes."""
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.dummy_weights import _hf_parameter_shapes, random_state_dict
from sluice.worker.loading.kv_scales import with_kv_scales
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.shapes import shape_config
from sluice.worker.loading.weights import load_checkpoint, to_worker_layout
from sluice.worker.models.config import ModelConfig
from sluice.worker.models.qwen2_5_vl import QwenVisionLanguageLM
from sluice.worker.models.registry import traits_for
from sluice.worker.ops.attention_metadata import AttentionMetadata
from sluice.worker.ops.plain_torch import TorchOps
from sluice.worker.runner.kv_cache import allocate_kv_cache
from tests.worker.rank_group import run_on_ranks
from tests.worker.stepping import BLOCK_SIZE, run_greedy
from tests.worker.tiny_qwen2_5_vl import GRIDS, IMAGE_TOKEN, TINY_QWEN2_5_VL, hf_model, images, prompt

TEXT = [5, 17, 99, 3, 42, 7, 61]
WORKER_CONFIG = WorkerConfig(model="tiny-qwen2.5-vl")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(transformers' model, the folder it saved itself to)."""
    folder = tmp_path_factory.mktemp("qwen2_5_vl")
    hf = hf_model()
    hf.save_pretrained(folder)
    return hf, folder


def _chunk(first: int, count: int) -> AttentionMetadata:
    """One sequence's tokens first..first + count - 1, in KV blocks 0, 1, ..."""
    positions = torch.arange(first, first + count)
    return AttentionMetadata(slot_mapping=positions, query_start_loc=torch.tensor([0, count], dtype=torch.int32),
                             seq_lens=torch.tensor([first + count], dtype=torch.int32),
                             block_tables=torch.arange(8, dtype=torch.int32)[None],
                             token_seq_index=torch.zeros(count, dtype=torch.int64),
                             token_query_pos=torch.arange(count), max_query_len=count, max_seq_len=first + count)


def _logits(model: QwenVisionLanguageLM, ids: list[int], grids: list,
            continuation: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the prompt's logits, the continuation's): the prompt prefilled with its images, then the continuation one
    token a step (decoding), each at its index plus the prompt's delta."""
    config = model.config
    kv_caches = allocate_kv_cache(config, 8, BLOCK_SIZE, torch.float32, torch.device("cpu"))
    cos_sin_cache = model.cos_sin_cache(8 * BLOCK_SIZE)
    positions, delta = model.prompt_positions(ids, torch.tensor(grids).view(-1, 3))
    with torch.inference_mode():
        embeddings = model.image_embeddings(*images(grids)) if grids else torch.zeros(0, config.hidden_size)
        image_rows = torch.nonzero(torch.tensor(ids) == IMAGE_TOKEN).flatten()
        logits = model.logits(*model.multimodal_hidden_states(torch.tensor(ids), positions, embeddings, image_rows,
                                                              cos_sin_cache, kv_caches, _chunk(0, len(ids)), None))
        decoded = [model(torch.tensor([token]), torch.tensor([index + delta]), cos_sin_cache, kv_caches,
                         _chunk(index, 1), None) for index, token in enumerate(continuation, start=len(ids))]
    return logits, torch.cat(decoded) if decoded else logits[:0]


def _hf_inputs(ids: list[int], grids: list) -> dict:
    input_ids = torch.tensor([ids])
    if not grids:
        return {"input_ids": input_ids}
    pixel_values, image_grid_thw = images(grids)
    return {"input_ids": input_ids, "pixel_values": pixel_values, "image_grid_thw": image_grid_thw,
            "mm_token_type_ids": (input_ids == IMAGE_TOKEN).int()}


@pytest.mark.parametrize("grids, kernels", [([], "torch"), (GRIDS[:1], "torch"), (GRIDS[1:3], "torch"),
                                            (GRIDS[1:3], "triton")],
                         ids=["text", "one image", "two images", "two images, Triton"])
def test_prompt_logits_and_greedy_decoding_match_transformers(checkpoint, grids, kernels):
    """The Triton kernels (interpreted on the CPU) read the step's own cos/sin rows as they read the rope table."""
    hf, folder = checkpoint
    loaded = ModelLoader(WorkerConfig(model="tiny-qwen2.5-vl", kernels=kernels)).build(*load_checkpoint(folder))
    ids = prompt(grids, TEXT)
    inputs = _hf_inputs(ids, grids)
    with torch.inference_mode():
        expected_logits = hf(**inputs).logits[0]
        expected = hf.generate(**inputs, max_new_tokens=8, do_sample=False, eos_token_id=None,
                               pad_token_id=0)[0, len(ids):].tolist()
    logits, decoded = _logits(loaded.model, ids, grids, expected[:-1])
    torch.testing.assert_close(logits, expected_logits, rtol=0, atol=1e-4)
    assert [int(logits[-1].argmax()), *decoded.argmax(-1).tolist()] == expected  # greedy at every step


def test_text_prompts_through_the_engine_match_transformers_generate(checkpoint):
    hf, folder = checkpoint
    engine = WorkerEngine(WORKER_CONFIG, ModelLoader(WORKER_CONFIG).build(*load_checkpoint(folder)))
    prompts = [TEXT, [42] * 9, list(range(100, 123))]
    with torch.inference_mode():
        expected = [hf.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=None,
                                pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    assert run_greedy(engine, prompts, 10, chunk=5) == expected


def test_weights_load_under_transformers_module_names(checkpoint, tmp_path):
    """A checkpoint of the module's state_dict (model.language_model.*, model.visual.*) reads as the published one
    transformers saves (model.*, visual.*)."""
    hf, folder = checkpoint
    published = load_checkpoint(folder)[1]
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    save_file({name: tensor.contiguous() for name, tensor in hf.state_dict().items()}, tmp_path / "model.safetensors")
    as_modules = load_checkpoint(tmp_path)[1]
    assert as_modules.keys() == published.keys()
    assert all(torch.equal(as_modules[name], tensor) for name, tensor in published.items())


def test_random_weights_are_the_published_checkpoints(checkpoint):
    _, folder = checkpoint
    with safe_open(folder / "model.safetensors", framework="pt") as file:
        saved = {name: tuple(file.get_slice(name).get_shape()) for name in file.keys()}
    drawn = random_state_dict(TINY_QWEN2_5_VL, torch.float32, torch.device("cpu"), seed=0)
    assert {name: tuple(tensor.shape) for name, tensor in drawn.items()} == saved
    assert all(drawn[name].eq(1).all() for name in drawn if "norm" in name or "ln_q" in name)


@pytest.mark.parametrize("shape", ["Qwen2.5-VL-3B", "Qwen2.5-VL-7B"])
def test_random_weights_of_the_published_shapes_fit_the_model(shape):
    """The shapes' weights as a dummy load lays them out, against the model's parameters (on the meta device)."""
    config = ModelConfig.from_hf(shape_config(shape))
    state = {name: torch.empty(size, device="meta") for name, size in _hf_parameter_shapes(config).items()}
    state = with_kv_scales(to_worker_layout(state, config), config.num_layers)
    with torch.device("meta"):
        model = QwenVisionLanguageLM(config, traits_for(config.architecture), TorchOps())
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    assert {name: tuple(tensor.shape) for name, tensor in state.items()} == expected
    assert expected["visual.merger.mlp.2.weight"] == (config.hidden_size, 5120)


def test_fp8_at_load_quantizes_the_language_model_only(checkpoint):
    _, folder = checkpoint
    model = ModelLoader(WorkerConfig(model="tiny-qwen2.5-vl", quantization="fp8")).build(*load_checkpoint(folder)).model
    assert model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
    assert model.visual.blocks[0].mlp.down_proj.weight.dtype == torch.float32
    _, decoded = _logits(model, prompt(GRIDS[:1], TEXT), GRIDS[:1], [5, 6])
    assert decoded.shape == (2, 256) and decoded.isfinite().all()


def _check_rank(group, folder) -> None:
    """The rank's part of the language model and the whole tower: the driver's logits are the whole model's."""
    whole = ModelLoader(WORKER_CONFIG).build(*load_checkpoint(folder))
    sharded = ModelLoader(WORKER_CONFIG, group).build(*load_checkpoint(folder, group.rank, group.world_size))
    assert sharded.model.layers[0].self_attn.num_heads == 2
    tower_gates = [loaded.model.visual.blocks[0].mlp.gate_proj.weight for loaded in (whole, sharded)]
    assert torch.equal(*tower_gates)  # the tower whole, though its MLP's names are the decoder's
    ids = prompt(GRIDS[1:3], TEXT)
    expected = _logits(whole.model, ids, GRIDS[1:3], [5, 6, 7])
    got = _logits(sharded.model, ids, GRIDS[1:3], [5, 6, 7])
    if group.is_driver:
        for logits, expected_logits in zip(got, expected):
            torch.testing.assert_close(logits, expected_logits, rtol=0, atol=1e-4)
    prompts = [TEXT, list(range(100, 123))]
    greedy = run_greedy(WorkerEngine(WORKER_CONFIG, sharded, group), prompts, 6, chunk=5)
    assert greedy == (run_greedy(WorkerEngine(WORKER_CONFIG, whole), prompts, 6, chunk=5) if group.is_driver
                      else [[]] * len(prompts))


def test_tensor_parallel_ranks_match_the_whole_model(checkpoint):
    run_on_ranks(_check_rank, 2, checkpoint[1])
