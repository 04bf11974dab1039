"""A pipeline stage's share of a model: the layer partition, the weights each stage reads from a checkpoint (its
layers', the embedding on the first stage, the final norm and the LM head on the last, a tied head read from the
embedding; a middle stage neither), the KV cache of its layers only, what a stage refuses at start, and the steps of
3 stages in processes of their own over gloo: Hugging Face's greedy tokens, the decodes through the decode graphs'
code (uncaptured on the CPU) and those that continue a decode step with no inputs built on the host."""
import json
from collections import Counter

import pytest
import torch

from sluice.core.sampling_params import SamplingParams
from sluice.core.step_plan import CachedRequest, NewRequest, StepPlan
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.dummy_weights import random_state_dict
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.weights import load_checkpoint
from sluice.worker.models.config import ModelConfig
from sluice.worker.parallel.group import ReplicaGroups
from sluice.worker.parallel.pipeline import PipelineStage, layer_partition
from tests.worker.rank_group import run_on_stages
from tests.worker.test_gemma_families import gemma_config
from tests.worker.test_model_families import _TINY, FAMILIES

THREE_LAYERS = {**_TINY, **FAMILIES["llama"], "num_hidden_layers": 3}  # tied embeddings
UNUSED_ADDRESS = "127.0.0.1:1"  # the stages below load and set up their caches without meeting


def test_layers_split_as_evenly_as_they_divide_or_as_partitioned():
    assert layer_partition(30, 2) == [range(0, 15), range(15, 30)]
    assert layer_partition(30, 4) == [range(0, 8), range(8, 16), range(16, 23), range(23, 30)]
    assert layer_partition(30, 3, "8,11,11") == [range(0, 8), range(8, 19), range(19, 30)]
    with pytest.raises(ValueError, match="pp_layer_partition '8,11' must give each of the 3 stages at least one "
                                         "layer, 30 in all"):
        layer_partition(30, 3, "8,11")
    with pytest.raises(ValueError, match="pipeline_parallel_size 3 exceeds the model's 2 layers"):
        layer_partition(2, 3)


@pytest.fixture(scope="module")
def three_layers(tmp_path_factory):
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("tiny-llama-3-layers")
    save_file(random_state_dict(THREE_LAYERS, torch.float32, torch.device("cpu"), seed=4), folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(THREE_LAYERS))
    return folder


@pytest.mark.parametrize("index, weights", [
    (0, {"embed_tokens.weight", "layers.0."}),
    (1, {"layers.1."}),
    (2, {"layers.2.", "norm.weight", "lm_head.weight"}),
])
def test_each_stage_reads_its_weights_and_holds_the_kv_of_its_layers(three_layers, index, weights):
    config = WorkerConfig(model=str(three_layers), load_format="auto", pipeline_parallel_size=3, rank=index,
                          dist_init_address=UNUSED_ADDRESS)
    engine = WorkerEngine.load(config, ReplicaGroups(None, PipelineStage(index, 3, range(0), 0, 1)))
    held = set(engine.model.model.state_dict())
    assert {name if not name.startswith("layers.") else name[:len("layers.0.")] for name in held} == weights
    assert engine.init_cache(block_size=16, num_blocks=8) == 8
    assert len(engine.runner.kv_caches) == 1


def test_a_family_with_a_decoder_module_of_its_own_is_refused_naming_it():
    config = ModelConfig.from_hf(gemma_config("gemma2"))
    loader = ModelLoader(WorkerConfig(model="gemma", pipeline_parallel_size=2, dist_init_address=UNUSED_ADDRESS),
                         stage=PipelineStage(0, 2, range(0), 0, 1))
    with pytest.raises(ValueError, match="pipeline parallelism does not split Gemma2ForCausalLM yet"):
        loader.build(config, {})


def test_a_draft_model_is_refused_naming_speculative_decoding(three_layers):
    checkpoint = load_checkpoint(three_layers)
    loader = ModelLoader(WorkerConfig(model=str(three_layers), pipeline_parallel_size=2,
                                      dist_init_address=UNUSED_ADDRESS), stage=PipelineStage(0, 2, range(0), 0, 1))
    with pytest.raises(ValueError, match=r"a draft model \(speculative decoding\) needs an unsharded worker"):
        loader.build(*checkpoint, draft=load_checkpoint(three_layers))


NUM_DECODES = 12  # both requests' steps after the prefill; then the second alone for as many
BLOCKS_PER_REQUEST = 4


def _plans(prompts: list[list[int]]) -> list[StepPlan]:
    """Both prompts prefilled in one step, NUM_DECODES decode steps of both, then NUM_DECODES of the second alone
    (the first finished: its row leaves the decode graphs' buffers)."""
    greedy = SamplingParams(max_tokens=2 * NUM_DECODES + 1, temperature=0.0, ignore_eos=True)
    ids = ["first", "second"]
    blocks = [list(range(r * BLOCKS_PER_REQUEST, (r + 1) * BLOCKS_PER_REQUEST)) for r in range(2)]
    plans = [StepPlan(0, [NewRequest(i, prompt, table, 0, greedy) for i, prompt, table in zip(ids, prompts, blocks)],
                      num_scheduled_tokens={i: len(prompt) for i, prompt in zip(ids, prompts)})]
    for step in range(1, 2 * NUM_DECODES + 1):
        decoding = ids if step <= NUM_DECODES else ids[1:]
        plans.append(StepPlan(step, cached_requests=[
            CachedRequest(i, [], len(prompts[ids.index(i)]) + step - 1, BLOCKS_PER_REQUEST) for i in decoding],
            num_scheduled_tokens=dict.fromkeys(decoding, 1),
            finished_request_ids=["first"] if step == NUM_DECODES + 1 else []))
    return plans


def _run_stage(stage: PipelineStage, model_dir: str, prompts: list[list[int]], results: str) -> None:
    """One stage's steps: launched all at once before the last (each decode reads the tokens that the last stage
    sent back), one at a time on the last. Writes the last stage's tokens and each stage's routes to results."""
    config = WorkerConfig(model=model_dir, pipeline_parallel_size=stage.num_stages, rank=stage.index,
                          dist_init_address=UNUSED_ADDRESS)
    engine = WorkerEngine.load(config, ReplicaGroups(None, stage))
    engine.init_cache(block_size=16, num_blocks=2 * BLOCKS_PER_REQUEST, max_num_seqs=4)
    routes, runner = Counter(), engine.runner
    replay, build = runner.decode_graphs.replay, runner.inputs.build
    runner.decode_graphs.replay = lambda *args: routes.update(["decode graph"]) or replay(*args)
    runner.inputs.build = lambda *args, **kwargs: routes.update(["host inputs"]) or build(*args, **kwargs)
    if stage.is_last:
        outcomes = [engine.execute(plan) for plan in _plans(prompts)]
    else:
        outcomes = [engine.finish(step) for step in [engine.launch(plan) for plan in _plans(prompts)]]
    tokens = {i: [o.sampled_token_ids[i] for o in outcomes if i in o.sampled_token_ids] for i in ("first", "second")}
    with open(f"{results}/stage{stage.index}.json", "w") as file:
        json.dump({"routes": routes, "tokens": tokens}, file)


def test_three_stages_decode_through_the_decode_graphs_and_match_hf(default_model_dir, hf_greedy_of, hf_tokenizer,
                                                                    tmp_path):
    """Every decode step on every stage replays the decode graphs (on the CPU their code runs uncaptured, between the
    transfers, as captured graphs replay on CUDA); all but the first of each batch take no inputs from the host."""
    prompts = [hf_tokenizer(text).input_ids for text in ("The capital of France is", "Water boils at")]
    run_on_stages(_run_stage, 3, str(default_model_dir), prompts, str(tmp_path))
    stages = [json.loads((tmp_path / f"stage{index}.json").read_text()) for index in range(3)]
    assert stages[2]["tokens"] == {"first": hf_greedy_of(prompts[0], NUM_DECODES + 1),
                                   "second": hf_greedy_of(prompts[1], 2 * NUM_DECODES + 1)}
    assert [stage["routes"] for stage in stages] == [{"decode graph": 2 * NUM_DECODES, "host inputs": 2}] * 3
