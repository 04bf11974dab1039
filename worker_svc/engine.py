import dataclasses
from functools import partial
from pathlib import Path

import torch

from sluice.core.step_plan import StepOutcome, StepPlan
from sluice.worker.config import WorkerConfig
from sluice.worker.loading.dummy_weights import dummy_checkpoint
from sluice.worker.loading.kv_scales import with_kv_scales
from sluice.worker.loading.weights import load_checkpoint, to_worker_layout
from sluice.worker.models.config import ModelConfig
from sluice.worker.models.decoder import DecoderLM
from sluice.worker.models.registry import traits_for
from sluice.worker.models.rope import build_cos_sin_cache
from sluice.worker.models.shard_layout import ShardLayout
from sluice.worker.models.tensor_parallel import TensorParallelDecoderLM
from sluice.worker.ops.fp8 import FP8, keep_stored_precision, quantize_linear_weights
from sluice.worker.ops.fp8_gemm import emulated_fp8_linear, fp8_gemm_for
from sluice.worker.ops.plain_torch import TorchOps
from sluice.worker.parallel.group import TensorParallelGroup
from sluice.worker.runner.decode_graphs import DecodeGraphs
from sluice.worker.runner.draft_proposer import DraftProposer
from sluice.worker.runner.forward_pass import ForwardPass
from sluice.worker.runner.kv_cache import allocate_kv_cache, bytes_per_block
from sluice.worker.runner.memory_profile import profile_kv_cache_bytes
from sluice.worker.runner.model_runner import LaunchedStep, ModelRunner
from sluice.worker.runner.piecewise_graphs import PiecewiseGraphs
from sluice.worker.runner.rank_samplers import DriverSampler, FollowerSampler
from sluice.worker.sampling.rows import SamplingRows
from sluice.worker.sampling.step import StepSampler
from sluice.worker.sampling.structured_output import GrammarMatchers, load_llguidance_tokenizer


class WorkerEngine:
    """The worker's core object: loads the model, sizes and owns the KV cache, executes steps. In a tensor-parallel
    group, it holds the rank's part of the model and of the KV cache (its heads), and only the driver samples."""

    def __init__(self, config: WorkerConfig, model_config: ModelConfig, state: dict[str, torch.Tensor],
                 group: TensorParallelGroup | None = None,
                 draft: tuple[ModelConfig, dict[str, torch.Tensor]] | None = None):
        """model_config: the whole model's; state: the rank's weights in the worker's layout (see
        weights.to_worker_layout). Quantization fp8 quantizes here the rank's projections of an unquantized checkpoint,
        each row with its own scale; a pre-quantized checkpoint's projections stay as it stores them.
        draft: the config and weights of a draft model (speculative method "draft"), of the same vocabulary."""
        self.config = config
        self.device = torch.device(config.device)
        self.kv_cache_dtype = config.kv_cache_torch_dtype
        torch.manual_seed(config.seed)
        if config.quantization == "fp8" and model_config.quantization is None:
            model_config, state = dataclasses.replace(model_config, quantization="fp8"), quantize_linear_weights(state)
        state = with_kv_scales(state, model_config.num_layers)
        self.model_config = model_config
        self.group = group
        self.layout = ShardLayout(model_config) if group is None else \
            ShardLayout(model_config, group.rank, group.world_size)
        self.local_config = self.layout.local_config()  # the rank's heads, intermediate and vocabulary columns
        self.ops = _operators(config, model_config)
        self.model = self._build_model(self.model_config, state)
        self.draft_config, self.draft_model = None, None
        if draft is not None:
            self.draft_config = _checked_draft_config(draft[0], model_config, group)
            draft_state = with_kv_scales(draft[1], self.draft_config.num_layers)
            self.draft_model = self._build_model(self.draft_config, draft_state)
        self.runner: ModelRunner | None = None

    @classmethod
    def load(cls, config: WorkerConfig, group: TensorParallelGroup | None = None) -> "WorkerEngine":
        """Materialises only the rank's shards of the weights, once the device is known to hold the KV cache's
        dtype."""
        if config.kv_cache_torch_dtype == FP8:
            _check_fp8_kv_cache(config, torch.device(config.device))
        rank, world_size = (0, 1) if group is None else (group.rank, group.world_size)
        draft = None
        if config.draft_model:
            draft = _load_weights(config, config.draft_model, config.draft_load_format, 0, 1)
        return cls(config, *_load_weights(config, config.model, config.load_format, rank, world_size), group, draft)

    def _build_model(self, model_config: ModelConfig, state: dict[str, torch.Tensor]) -> DecoderLM:
        """The target (a tensor-parallel rank's part of it in a group) or, of another config, the draft model."""
        traits = traits_for(model_config.architecture)
        with torch.device("meta"):
            model = DecoderLM(model_config, traits, self.ops) if self.group is None else \
                TensorParallelDecoderLM(self.layout, traits, self.ops, self.group)
            keep_stored_precision(model, state)
        model.load_state_dict({name: self._placed(name, tensor) for name, tensor in state.items()}, strict=True,
                              assign=True)
        if model_config.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        return model.eval()

    def _placed(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor on the device, in the model dtype unless it is an FP8 weight or a float32 scale (a weight's,
        or the KV cache's)."""
        if tensor.dtype == FP8 or name.endswith("_scale"):
            return tensor.to(self.device)
        return tensor.to(self.device, self.config.torch_dtype)

    def init_cache(self, block_size: int, num_blocks: int = 0, max_num_batched_tokens: int = 8192,
                   max_num_seqs: int = 256, max_model_len: int = 8192) -> int:
        """Allocates the KV cache (num_blocks 0: sized from the memory budget) and captures the CUDA graphs. With
        a draft model, each block also holds the draft's KV of its slots, in a cache of the draft's own."""
        max_model_len = min(max_model_len, self.max_model_len)
        cos_sin_cache = _cos_sin_cache(self.model_config, max_model_len, self.device)
        if num_blocks <= 0:
            block_bytes = bytes_per_block(self.local_config, block_size, self.kv_cache_dtype)
            if self.draft_config is not None:
                block_bytes += bytes_per_block(self.draft_config, block_size, self.config.torch_dtype)
            num_blocks = self._kv_cache_bytes(cos_sin_cache, block_size, max_num_batched_tokens, max_num_seqs) \
                // block_bytes
            if self.group is not None:
                num_blocks = self.group.min(num_blocks)  # one pool: the same block ids on every rank
        kv_caches = allocate_kv_cache(self.local_config, num_blocks, block_size, self.kv_cache_dtype, self.device)
        graphed = partial(self._forward_pass, max_num_batched_tokens=max_num_batched_tokens,
                          max_num_seqs=max_num_seqs, max_blocks_per_seq=-(-max_model_len // block_size))
        forward = graphed(self.model, kv_caches, cos_sin_cache, calculate_kv_scales=self.config.calculate_kv_scales)
        drafter = None
        if self.draft_model is not None:
            draft_caches = allocate_kv_cache(self.draft_config, num_blocks, block_size, self.config.torch_dtype,
                                             self.device)
            drafter = DraftProposer(graphed(self.draft_model, draft_caches,
                                            _cos_sin_cache(self.draft_config, max_model_len, self.device)),
                                    block_size, self.device)
        self.runner = ModelRunner(forward, block_size, self.device, self._sampler(), drafter)
        return num_blocks

    def _forward_pass(self, model: DecoderLM, kv_caches, cos_sin_cache: torch.Tensor, max_num_batched_tokens: int,
                      max_num_seqs: int, max_blocks_per_seq: int, calculate_kv_scales: bool = False) -> ForwardPass:
        """The model's pass with its CUDA graphs captured (unless eager; uncaptured off CUDA, decode steps still keep
        their inputs on the device)."""
        decode_graphs = piecewise_graphs = None
        if self.uses_graphs:
            piecewise_graphs = PiecewiseGraphs(model, kv_caches, cos_sin_cache, max_num_batched_tokens, self.device)
        if not self.config.enforce_eager:
            decode_graphs = DecodeGraphs(model, kv_caches, cos_sin_cache, max_num_seqs, max_blocks_per_seq,
                                         self.device, capture=self.uses_graphs)
        return ForwardPass(model, kv_caches, cos_sin_cache, decode_graphs, piecewise_graphs, calculate_kv_scales)

    @property
    def uses_graphs(self) -> bool:
        return self.device.type == "cuda" and not self.config.enforce_eager

    @property
    def max_model_len(self) -> int:
        """The longest request both models (the target and any draft) take."""
        lengths = [config.max_position_embeddings for config in (self.model_config, self.draft_config) if config]
        return min(lengths)

    def _sampler(self) -> StepSampler | FollowerSampler:
        if self.group is not None and not self.group.is_driver:
            return FollowerSampler(self.group)
        config = self.model_config
        load_tokenizer = None
        if self.config.load_format != "dummy":
            load_tokenizer = partial(load_llguidance_tokenizer, Path(self.config.model), config.vocab_size,
                                     config.eos_token_ids)
        parts = (SamplingRows(config.vocab_size, config.eos_token_ids, self.device),
                 GrammarMatchers(load_tokenizer, config.vocab_size, self.device), self.config.seed)
        return StepSampler(*parts) if self.group is None else DriverSampler(self.group, *parts)

    def _kv_cache_bytes(self, cos_sin_cache, block_size: int, max_num_batched_tokens: int, max_num_seqs: int) -> int:
        if self.device.type != "cuda":
            return self.config.kv_cache_bytes
        return profile_kv_cache_bytes(self.model, self.local_config, cos_sin_cache, block_size, self.kv_cache_dtype,
                                      max_num_batched_tokens, max_num_seqs, self.config.gpu_memory_utilization)

    @property
    def num_live_requests(self) -> int:
        """Requests whose state the worker holds (a drain waits for none)."""
        return 0 if self.runner is None else len(self.runner.batch.requests)

    def launch(self, plan: StepPlan) -> LaunchedStep:
        """Queues the step on the device and returns without waiting for it; `finish` collects its outcome."""
        if self.runner is None:
            raise RuntimeError("init_cache must run before the first step")
        return self.runner.launch(plan)

    def finish(self, step: LaunchedStep) -> StepOutcome:
        return self.runner.finish(step)

    def execute(self, plan: StepPlan) -> StepOutcome:
        return self.finish(self.launch(plan))


def _load_weights(config: WorkerConfig, model: str, load_format: str, rank: int,
                  world_size: int) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A model's config and the rank's weights in the worker's layout: random ones of a named shape with load_format
    "dummy", else read from a checkpoint."""
    if load_format == "dummy":
        hf_config, hf_state = dummy_checkpoint(model, config.torch_dtype, torch.device(config.device), config.seed,
                                               rank, world_size)
        model_config = ModelConfig.from_hf(hf_config)
        return model_config, to_worker_layout(hf_state, model_config)
    return load_checkpoint(Path(model), rank, world_size)


def _checked_draft_config(draft: ModelConfig, target: ModelConfig, group: TensorParallelGroup | None) -> ModelConfig:
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"the draft model's vocabulary ({draft.vocab_size} tokens) is not the target's "
                         f"({target.vocab_size}): a draft must share the target's tokenizer")
    if group is not None:
        raise ValueError("a draft model needs an unsharded worker (tensor-parallel size 1)")
    return draft


def _cos_sin_cache(config: ModelConfig, max_model_len: int, device: torch.device) -> torch.Tensor:
    return build_cos_sin_cache(config.head_dim, max_model_len, config.rope_theta, config.rope_scaling,
                               torch.float32).to(device)


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
    return TritonOps(fp8_gemm_for(device, TritonOps.quantize_rows, bound) if fp8 else emulated_fp8_linear)


def _check_fp8_kv_cache(config: WorkerConfig, device: torch.device) -> None:
    """An FP8 KV cache runs on the CPU's torch operators, or on CUDA with FP8 conversions (compute capability
    8.9+, which Triton's e4m3 needs); anything else fails here, at start."""
    if device.type == "cpu" and not config.uses_triton:
        return
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9):
        return
    if device.type == "cpu":
        reason = "the Triton interpreter rounds FP8 stores wrongly; the CPU's default torch kernels support it"
    elif device.type == "cuda":
        reason = f"{device} ({torch.cuda.get_device_name(device)}) is below CUDA compute capability 8.9"
    else:
        reason = f"{device} is neither the CPU nor CUDA"
    raise RuntimeError(f"kv_cache_dtype {config.kv_cache_dtype!r} with kernels {config.kernels!r} on {device}: "
                       f"{reason}")
