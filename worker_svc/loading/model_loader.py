"""The worker's loading half: a model's weights read as the rank's shards and built into the models it runs."""
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from sluice.worker.config import WorkerConfig
from sluice.worker.loading.dummy_w4a16 import as_dummy_w4a16
from sluice.worker.loading.dummy_weights import dummy_checkpoint
from sluice.worker.loading.kv_scales import with_kv_scales
from sluice.worker.loading.w4a16_checkpoint import W4A16_METHODS
from sluice.worker.loading.weights import load_checkpoint, to_worker_layout
from sluice.worker.models.config import ModelConfig
from sluice.worker.models.decoder import DecoderLM
from sluice.worker.models.families import FAMILY_MODELS, model_classes
from sluice.worker.models.moe import keep_stored_expert_precision
from sluice.worker.models.pipeline_stage import PipelineStageLM, cut_to_stage
from sluice.worker.models.registry import ARCHITECTURES, traits_for
from sluice.worker.models.shard_layout import ShardLayout
from sluice.worker.ops.fp8 import FP8, keep_stored_precision, quantize_linear_weights
from sluice.worker.ops.fp8_gemm import emulated_fp8_linear, fp8_gemm_for
from sluice.worker.ops.packed_linear import pack_linears, packs_linears
from sluice.worker.ops.plain_torch import TorchOps
from sluice.worker.ops.w4a16 import as_w4a16_experts, as_w4a16_linears
from sluice.worker.parallel.group import TensorParallelGroup
from sluice.worker.parallel.pipeline import PipelineStage, layer_partition

Checkpoint = tuple[ModelConfig, dict[str, torch.Tensor]]  # a model's config and the rank's weights, worker layout


@dataclass(slots=True)
class LoadedModel:
    """The models a worker runs, on its device: the target and, for speculative method "draft", a draft model."""

    config: ModelConfig  # the whole model's
    # the rank's part of it: its heads, intermediate and vocabulary columns, and its pipeline stage's layers
    # (num_layers: those whose KV it holds)
    local_config: ModelConfig
    ops: TorchOps  # the operators every module of both models calls
    model: DecoderLM | PipelineStageLM  # in a tensor-parallel group or a pipeline stage, the rank's part of the target
    draft_config: ModelConfig | None = None  # a smaller model of the same vocabulary
    draft_model: DecoderLM | None = None
    stage: PipelineStage | None = None  # the rank's pipeline stage, its layers set


class ModelLoader:
    """Reads a worker's checkpoints (or random weights of a named shape) and builds its models on the operators its
    device runs. In a tensor-parallel group, only the rank's shards of the weights are materialised; in a pipeline
    stage, only its layers' (and the embedding's, the final norm's and the LM head's where the stage runs them)."""

    def __init__(self, config: WorkerConfig, group: TensorParallelGroup | None = None,
                 stage: PipelineStage | None = None):
        """stage: the rank's pipeline stage, whose layers the model's config sets here."""
        self.config = config
        self.group = group
        self.stage = stage
        self.device = torch.device(config.device)

    def load(self) -> LoadedModel:
        """The configured model and any draft model, from their checkpoints or as random weights."""
        rank, world_size = (0, 1) if self.group is None else (self.group.rank, self.group.world_size)
        draft = None
        if self.config.draft_model:
            draft = self._read(self.config.draft_model, self.config.draft_load_format, 0, 1)
        return self.build(*self._read(self.config.model, self.config.load_format, rank, world_size), draft)

    def build(self, model_config: ModelConfig, state: dict[str, torch.Tensor],
              draft: Checkpoint | None = None) -> LoadedModel:
        """model_config: the whole model's; state: the rank's weights in the worker's layout (see
        weights.to_worker_layout). Quantization fp8 quantizes here the rank's projections and experts of an unquantized
        checkpoint, each row with its own scale; a pre-quantized checkpoint's stay as it stores them.
        draft: the config and weights of a draft model (speculative method "draft"), of the same vocabulary."""
        if model_config.quantization == "fp8" and traits_for(model_config.architecture).stacked_experts:
            raise ValueError(f"a pre-quantized FP8 checkpoint of {model_config.architecture} is not supported (its "
                             "stacked experts' FP8 layout is not read): load its unquantized or MXFP4 weights with "
                             "--quantization fp8")
        _check_quantization_flag(self.config.quantization, model_config.quantization)
        if self.config.quantization == "fp8" and model_config.quantization is None:
            model_config, state = replace(model_config, quantization="fp8"), quantize_linear_weights(state)
        state = with_kv_scales(state, model_config.num_layers)
        layout = ShardLayout(model_config) if self.group is None else \
            ShardLayout(model_config, self.group.rank, self.group.world_size, self.config.enable_expert_parallel)
        ops = _operators(self.config, model_config)
        local_config, stage = layout.local_config(), self._stage_of(model_config)
        if stage is not None:
            local_config = replace(local_config, num_layers=len(stage.layers))
            state = {name: tensor for name, tensor in state.items()
                     if stage.holds(name) and (stage.is_first or not name.startswith("embed_tokens."))}
        loaded = LoadedModel(model_config, local_config, ops, self._build_model(model_config, state, ops, layout,
                                                                                stage), stage=stage)
        if draft is not None:
            loaded.draft_config = _checked_draft_config(draft[0], model_config, self.group or stage)
            draft_state = with_kv_scales(draft[1], loaded.draft_config.num_layers)
            loaded.draft_model = self._build_model(loaded.draft_config, draft_state, ops)
        return loaded

    def _read(self, model: str, load_format: str, rank: int, world_size: int) -> Checkpoint:
        """A model's config and the rank's weights in the worker's layout: random ones of a named shape with
        load_format "dummy" (their projections in 4 bits where --quantization names a 4-bit method), else read from a
        checkpoint."""
        if load_format == "dummy":
            hf_config, hf_state = dummy_checkpoint(model, self.config.torch_dtype, self.device, self.config.seed,
                                                   rank, world_size, self.config.enable_expert_parallel)
            model_config = ModelConfig.from_hf(hf_config)
            state = to_worker_layout(hf_state, model_config)
            if self.config.quantization in W4A16_METHODS:
                method = self.config.quantization
                return replace(model_config, quantization=method), as_dummy_w4a16(state, method)
            return model_config, state
        return load_checkpoint(Path(model), rank, world_size, self.config.enable_expert_parallel,
                               None if self.stage is None else lambda config: self._stage_of(config).holds)

    def _stage_of(self, model_config: ModelConfig) -> PipelineStage | None:
        """The rank's pipeline stage with its layers; a family with a decoder module of its own is not split."""
        if self.stage is None:
            return None
        if model_config.architecture in FAMILY_MODELS:
            raise ValueError(f"pipeline parallelism does not split {model_config.architecture} yet (only the "
                             "Llama-family decoders); serve it at pipeline_parallel_size 1")
        partition = layer_partition(model_config.num_layers, self.stage.num_stages, self.config.pp_layer_partition)
        return replace(self.stage, layers=partition[self.stage.index])

    def _build_model(self, model_config: ModelConfig, state: dict[str, torch.Tensor], ops: TorchOps,
                     layout: ShardLayout | None = None,
                     stage: PipelineStage | None = None) -> DecoderLM | PipelineStageLM:
        """The target (in a group, the rank's part of it, as layout cuts it; in a pipeline stage, the stage's
        layers) or, of another config, the draft model."""
        traits = traits_for(model_config.architecture)
        whole_model, rank_model = model_classes(model_config.architecture)
        with torch.device("meta"):
            model = whole_model(model_config, traits, ops) if self.group is None else \
                rank_model(layout, traits, ops, self.group)
            if stage is not None:
                cut_to_stage(model, stage)
            keep_stored_precision(model, state)
            as_w4a16_linears(model, state)
            as_w4a16_experts(model, state)
            keep_stored_expert_precision(model, state)
        _check_weight_names(model_config.architecture, set(model.state_dict()), set(state))
        model.load_state_dict({name: self._placed(name, tensor) for name, tensor in state.items()}, strict=True,
                              assign=True)
        if model_config.tie_word_embeddings and stage is None:
            model.lm_head.weight = model.embed_tokens.weight
        if self.config.kernels == "auto" and packs_linears(self.device, self.config.torch_dtype):
            pack_linears(model)
        return model.eval() if stage is None else PipelineStageLM(model.eval(), stage, self.config.torch_dtype)

    def _placed(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor on the device, in the model dtype unless it is an FP8 weight, a float32 scale (a weight's, or
        the KV cache's), integers (an expert map) or attention sinks (float32, as the attention kernels read them)."""
        if name.endswith(".sinks"):
            return tensor.to(self.device, torch.float32)
        if tensor.dtype == FP8 or name.endswith("_scale") or not tensor.is_floating_point():
            return tensor.to(self.device)
        return tensor.to(self.device, self.config.torch_dtype)


def _check_weight_names(architecture: str, expected: set[str], given: set[str]) -> None:
    """A checkpoint's weights are the modules' own: one the worker does not expect, or one it misses, is named."""
    unexpected, missing = sorted(given - expected), sorted(expected - given)
    if unexpected or missing:
        problems = [f"{what}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                    for what, names in (("weights the worker does not expect", unexpected),
                                        ("weights missing", missing)) if names]
        raise ValueError(f"the {architecture} checkpoint does not match the worker's {architecture} model; "
                         f"{'; '.join(problems)} (supported architectures: {sorted(ARCHITECTURES)})")


def _check_quantization_flag(flag: str, stored: str | None) -> None:
    """--quantization names a 4-bit method only to check that the checkpoint is one (4-bit weights are read, never
    made at load); fp8 quantizes an unquantized checkpoint, not a 4-bit one."""
    if flag in W4A16_METHODS and flag != stored:
        raise ValueError(f"--quantization {flag} needs a {flag} checkpoint (4-bit weights are not quantized at load); "
                         f"this one is {stored or 'unquantized'}")
    if flag == "fp8" and stored in W4A16_METHODS:
        raise ValueError(f"--quantization fp8 does not quantize a 4-bit ({stored}) checkpoint again: serve it with "
                         f"--quantization auto or {stored}")


def _checked_draft_config(draft: ModelConfig, target: ModelConfig,
                          group: TensorParallelGroup | PipelineStage | None) -> ModelConfig:
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"the draft model's vocabulary ({draft.vocab_size} tokens) is not the target's "
                         f"({target.vocab_size}): a draft must share the target's tokenizer")
    if group is not None:
        raise ValueError("a draft model (speculative decoding) needs an unsharded worker (tensor- and "
                         "pipeline-parallel size 1)")
    return draft


def _operators(config: WorkerConfig, model_config: ModelConfig) -> TorchOps:
    """Triton is imported only where its kernels are chosen: a CPU install need not have it. An FP8 model on a
    device without FP8 GEMMs fails here (fp8_gemm.fp8_gemm_for)."""
    device = torch.device(config.device)
    fp8, bound = model_config.quantization == "fp8", model_config.activation_absmax_bound
    if not config.uses_triton:
        return TorchOps(fp8_gemm_for(device, absmax_bound=bound) if fp8 else emulated_fp8_linear)
    try:
        from sluice.worker.ops.triton_kernels import TritonOps
    except ImportError as error:
        message = f"kernels {config.kernels!r} on {config.device} need triton (the 'gpu' extra): {error}"
        raise RuntimeError(message) from error
    return TritonOps(fp8_gemm_for(device, TritonOps.quantize_rows, bound) if fp8 else emulated_fp8_linear,
                     config.dependent_launch)
