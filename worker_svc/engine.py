from pathlib import Path

import torch

from scheduler_svc.step_plan import StepOutcome, StepPlan
from worker_svc.config import WorkerConfig
from worker_svc.kv_cache import allocate_kv_cache, bytes_per_block
from worker_svc.model_config import ModelConfig
from worker_svc.model_runner import ModelRunner
from worker_svc.models.decoder import DecoderLM
from worker_svc.models.registry import traits_for
from worker_svc.rope import build_cos_sin_cache
from worker_svc.torch_ops import TorchOps
from worker_svc.weights import load_checkpoint


class WorkerEngine:
    """The worker's core object: loads the model, sizes and owns the KV cache, executes steps."""

    def __init__(self, config: WorkerConfig):
        self.config = config
        self.device = torch.device(config.device)
        torch.manual_seed(config.seed)
        self.model_config, state = load_checkpoint(Path(config.model))
        self.model = self._build_model(state)
        self.runner: ModelRunner | None = None

    def _build_model(self, state: dict[str, torch.Tensor]) -> DecoderLM:
        with torch.device("meta"):
            model = DecoderLM(self.model_config, traits_for(self.model_config.architecture), TorchOps())
        model.load_state_dict(state, strict=True, assign=True)
        if self.model_config.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        return model.to(device=self.device, dtype=self.config.torch_dtype).eval()

    def init_cache(self, block_size: int, num_blocks: int = 0) -> int:
        if num_blocks <= 0:
            num_blocks = self.config.kv_cache_bytes // bytes_per_block(self.model_config, block_size,
                                                                       self.config.torch_dtype)
        kv_caches = allocate_kv_cache(self.model_config, num_blocks, block_size, self.config.torch_dtype, self.device)
        cos_sin_cache = build_cos_sin_cache(self.model_config.head_dim, self.model_config.max_position_embeddings,
                                            self.model_config.rope_theta, self.model_config.rope_scaling).to(self.device)
        self.runner = ModelRunner(self.model, kv_caches, cos_sin_cache, block_size, self.device)
        return num_blocks

    def execute(self, plan: StepPlan) -> StepOutcome:
        if self.runner is None:
            raise RuntimeError("init_cache must run before the first step")
        return self.runner.execute(plan)
