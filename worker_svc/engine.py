"""The worker's core object: KV cache, CUDA graphs and steps, over the models a ModelLoader built."""
import time
from functools import partial
from pathlib import Path

import torch

from sluice.core.step_plan import StepOutcome, StepPlan
from sluice.worker.config import WorkerConfig
from sluice.worker.kv_transfer.agent import KvTransferAgent
from sluice.worker.loading.model_loader import LoadedModel, ModelLoader
from sluice.worker.models.decoder import DecoderLM
from sluice.worker.models.pipeline_stage import PipelineStageLM
from sluice.worker.ops.fp8 import FP8
from sluice.worker.parallel.group import ReplicaGroups, TensorParallelGroup, replica_min
from sluice.worker.runner.decode_graphs import DecodeGraphs
from sluice.worker.runner.draft_proposer import DraftProposer
from sluice.worker.runner.forward_pass import ForwardPass
from sluice.worker.runner.kv_cache import allocate_kv_cache, bytes_per_block
from sluice.worker.runner.memory_profile import profile_kv_cache_bytes
from sluice.worker.runner.model_runner import LaunchedStep, ModelRunner
from sluice.worker.runner.piecewise_graphs import PiecewiseGraphs
from sluice.worker.runner.rank_samplers import DriverSampler, FollowerSampler
from sluice.worker.runner.stage_forward_pass import StageForwardPass
from sluice.worker.sampling.rows import SamplingRows
from sluice.worker.sampling.step import StepSampler
from sluice.worker.sampling.structured_output import GrammarMatchers, load_llguidance_tokenizer
from sluice.worker.sampling.warm_up import warm_up_sampler


class WorkerEngine:
    """The worker's core object: sizes and owns the KV cache, executes steps on the models a ModelLoader built. In a
    tensor-parallel group, it holds the rank's part of the model and of the KV cache (its heads), and only the driver
    samples; in a pipeline stage, the stage's layers and their KV, and the last stage's driver samples."""

    def __init__(self, config: WorkerConfig, loaded: LoadedModel, group: TensorParallelGroup | None = None):
        """loaded: the models on the rank's weights, built by a ModelLoader of the same config and group."""
        self.config = config
        self.device = torch.device(config.device)
        self.kv_cache_dtype = config.kv_cache_torch_dtype
        torch.manual_seed(config.seed)
        self.model_config, self.local_config = loaded.config, loaded.local_config
        self.group = group
        self.stage = loaded.stage
        self.model = loaded.model
        self.draft_config, self.draft_model = loaded.draft_config, loaded.draft_model
        self.runner: ModelRunner | None = None
        self.kv_transfer: KvTransferAgent | None = None  # of a prefill or decode worker, once its cache is set up
        self.warm_up_seconds = 0.0  # init_cache's sampler warm-up

    @classmethod
    def load(cls, config: WorkerConfig, groups: ReplicaGroups = ReplicaGroups(None, None)) -> "WorkerEngine":
        """Loads the models (ModelLoader.load), once the device is known to hold the KV cache's dtype."""
        if config.kv_cache_torch_dtype == FP8:
            _check_fp8_kv_cache(config, torch.device(config.device))
        return cls(config, ModelLoader(config, *groups).load(), groups.tensor)

    def init_cache(self, block_size: int, num_blocks: int = 0, max_num_batched_tokens: int = 8192,
                   max_num_seqs: int = 256, max_model_len: int = 8192, max_num_encoder_input_tokens: int = 0,
                   encoder_cache_size: int = 0) -> int:
        """Allocates the KV cache (num_blocks 0: sized from the memory budget), captures the CUDA graphs (each
        decode batch size's and prefill size's pass runs once before its capture, which compiles its kernels) and
        warms the sampler up (sampling.warm_up): no request compiles a kernel. With a draft model, each block also
        holds the draft's KV of its slots, in a cache of the draft's own. A model that takes images keeps the memory
        of its vision tower's pass over max_num_encoder_input_tokens placeholders and of encoder_cache_size
        placeholders' outputs out of the KV cache's."""
        self.runner = self.kv_transfer = None  # a worker set up again (its scheduler lost it) frees the old cache
        max_model_len = min(max_model_len, self.max_model_len)
        if self.stage is not None:
            self.model.hold_received(max(max_num_batched_tokens, max_num_seqs), self.device)
        cos_sin_cache = self.model.cos_sin_cache(max_model_len).to(self.device)
        if num_blocks <= 0:
            block_bytes = bytes_per_block(self.local_config, block_size, self.kv_cache_dtype)
            if self.draft_config is not None:
                block_bytes += bytes_per_block(self.draft_config, block_size, self.config.torch_dtype)
            image_tokens = (max_num_encoder_input_tokens, encoder_cache_size) if self.model.takes_images else (0, 0)
            num_blocks = self._kv_cache_bytes(cos_sin_cache, block_size, max_num_batched_tokens, max_num_seqs,
                                              *image_tokens) // block_bytes
            if self.group is not None or self.stage is not None:
                num_blocks = replica_min(num_blocks, self.device)  # one pool: the same block ids on every rank
        kv_caches = allocate_kv_cache(self.local_config, num_blocks, block_size, self.kv_cache_dtype, self.device)
        if self.config.kv_role != "both":
            self.kv_transfer = KvTransferAgent(f"sluice-{self.config.kv_role}-rank{self.config.rank}", kv_caches,
                                               serves_reads=self.config.kv_role == "prefill")
        graphed = partial(self._forward_pass, max_num_batched_tokens=max_num_batched_tokens,
                          max_num_seqs=max_num_seqs, max_blocks_per_seq=-(-max_model_len // block_size))
        forward = graphed(self.model, kv_caches, cos_sin_cache, calculate_kv_scales=self.config.calculate_kv_scales)
        drafter = None
        if self.draft_model is not None:
            draft_caches = allocate_kv_cache(self.draft_config, num_blocks, block_size, self.config.torch_dtype,
                                             self.device)
            drafter = DraftProposer(graphed(self.draft_model, draft_caches,
                                            self.draft_model.cos_sin_cache(max_model_len).to(self.device)),
                                    block_size, self.device)
        started = time.perf_counter()
        warm_up_sampler(self.model_config.vocab_size, self.device)
        self.warm_up_seconds = time.perf_counter() - started
        self.runner = ModelRunner(forward, block_size, self.device, self._sampler(), drafter)
        return num_blocks

    def _forward_pass(self, model: DecoderLM | PipelineStageLM, kv_caches, cos_sin_cache: torch.Tensor,
                      max_num_batched_tokens: int, max_num_seqs: int, max_blocks_per_seq: int,
                      calculate_kv_scales: bool = False) -> ForwardPass:
        """The model's pass with its CUDA graphs captured (unless eager; uncaptured off CUDA, decode steps still keep
        their inputs on the device); a pipeline stage's graphs, of its layers, between its transfers."""
        decode_graphs = piecewise_graphs = None
        if self.uses_graphs:
            piecewise_graphs = PiecewiseGraphs(model, kv_caches, cos_sin_cache, max_num_batched_tokens, self.device)
        if not self.config.enforce_eager:
            decode_graphs = DecodeGraphs(model, kv_caches, cos_sin_cache, max_num_seqs, max_blocks_per_seq,
                                         self.device, capture=self.uses_graphs)
        forward_pass = ForwardPass if self.stage is None else StageForwardPass
        return forward_pass(model, kv_caches, cos_sin_cache, decode_graphs, piecewise_graphs, calculate_kv_scales)

    @property
    def uses_graphs(self) -> bool:
        return self.device.type == "cuda" and not self.config.enforce_eager

    @property
    def attention_window(self) -> int:
        """Tokens back that a query reads in every layer of the models whose KV the block tables place (0: all)."""
        windows = [config.attention_window for config in (self.model_config, self.draft_config) if config]
        return 0 if 0 in windows else max(windows)

    @property
    def max_model_len(self) -> int:
        """The longest request both models (the target and any draft) take."""
        lengths = [config.max_position_embeddings for config in (self.model_config, self.draft_config) if config]
        return min(lengths)

    def _sampler(self) -> StepSampler | FollowerSampler:
        if (self.group is not None and not self.group.is_driver) or (self.stage is not None and not self.stage.is_last):
            return FollowerSampler(self.group, self.stage)
        config = self.model_config
        load_tokenizer = None
        if self.config.load_format != "dummy":
            load_tokenizer = partial(load_llguidance_tokenizer, Path(self.config.model), config.vocab_size,
                                     config.eos_token_ids)
        parts = (SamplingRows(config.vocab_size, config.eos_token_ids, self.device),
                 GrammarMatchers(load_tokenizer, config.vocab_size, self.device), self.config.seed)
        if self.group is None and self.stage is None:
            return StepSampler(*parts)
        return DriverSampler(self.group, self.stage, *parts)

    def _kv_cache_bytes(self, cos_sin_cache, block_size: int, max_num_batched_tokens: int, max_num_seqs: int,
                        max_num_encoder_input_tokens: int, encoder_cache_size: int) -> int:
        if self.device.type != "cuda":
            return self.config.kv_cache_bytes
        encoder_cache_bytes = encoder_cache_size * self.model_config.hidden_size * self.config.torch_dtype.itemsize
        return profile_kv_cache_bytes(self.model, self.local_config, cos_sin_cache, block_size, self.kv_cache_dtype,
                                      max_num_batched_tokens, max_num_seqs, self.config.gpu_memory_utilization,
                                      max_num_encoder_input_tokens) - encoder_cache_bytes

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
