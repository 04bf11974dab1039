"""The worker's settings: what it loads, in which precision, on which device, with which kernels."""
from dataclasses import dataclass

from sluice.core.kv_transfer import KV_ROLES
from sluice.core.options import option

DTYPES = ("float32", "bfloat16", "float16")
FP8_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3")  # e4m3; "auto": the model dtype
LOAD_FORMATS = ("auto", "dummy")
QUANTIZATIONS = ("auto", "fp8", "awq", "gptq", "compressed-tensors")  # the last three: 4-bit checkpoints
KERNELS = ("auto", "triton", "torch")


@dataclass(slots=True)
class WorkerConfig:
    model: str = option("", help="a Hugging Face folder or a .gguf file, or a shape name with --load-format dummy "
                                 "(default: SmolLM2-135M)")
    load_format: str = option("auto", choices=LOAD_FORMATS,
                              help="auto: a folder or .gguf file; dummy: random weights of a named shape")
    dtype: str = option("float32", choices=DTYPES, help="the weights' and activations' dtype")
    quantization: str = option("auto", choices=QUANTIZATIONS,
                               help="fp8: the decoder layers' projections and experts in e4m3 with per-channel scales, "
                                    "activations quantized per token (a GPU needs compute capability 8.9+; the CPU "
                                    "emulates it); auto: as the checkpoint stores them (a pre-quantized FP8 folder "
                                    "is served in FP8, a GPTQ, AWQ or compressed-tensors 4-bit one in 4 bits); awq, "
                                    "gptq, compressed-tensors: as auto, but the checkpoint must be of that method")
    kv_cache_dtype: str = option("auto", choices=("auto", *FP8_KV_CACHE_DTYPES),
                                 help="fp8 (fp8_e4m3): the KV cache in e4m3 with per-layer k/v scales from the "
                                      "checkpoint (1.0 where it has none), about twice the blocks of bf16 (a GPU "
                                      "needs compute capability 8.9+); auto: the model dtype")
    calculate_kv_scales: bool = option(False, help="with --kv-cache-dtype fp8: each layer's k/v scales from the keys "
                                                   "and values of the first step, for checkpoints without "
                                                   "calibrated ones")
    device: str = option("cpu", help="cpu, cuda or cuda:K")
    kv_cache_gib: float = option(1.0, help="the KV cache's budget on the CPU, in GiB")
    gpu_memory_utilization: float = option(0.9, help="the share of the GPU's memory the worker may use")
    enforce_eager: bool = option(False, help="no CUDA graphs; every step builds its inputs on the host")
    dependent_launch: bool = option(True, flag="--no-dependent-launch",
                                    help="no programmatic dependent launch: on Hopper and newer, each kernel of the "
                                         "decode path otherwise starts while the one before it finishes")
    kernels: str = option("auto", choices=KERNELS,
                          help="auto: Triton kernels on a GPU; on the CPU plain torch, its projections through "
                               "oneDNN with weights packed at load (float32 and bfloat16, where torch has oneDNN); "
                               "torch: plain torch, projections by F.linear")
    cpu_reserved_cores: int = option(1, help="on the CPU: the cores a step of at most 8 tokens leaves free for the "
                                             "services' own work (the worker's RPCs, and the router and scheduler "
                                             "where they share the machine); larger steps use every core")
    compile_cache: str = option("", help="a folder for the kernels that Triton and torch inductor compile (their "
                                         "TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR): on a volume that outlives "
                                         "the process, a restarted worker compiles none again; empty: their own "
                                         "defaults")
    seed: int = 0
    tensor_parallel_size: int = option(1, short="-tp",
                                       help="worker processes (ranks) that serve one model replica together; with "
                                            "--device cuda, rank r runs on cuda:r (cuda:K: on cuda:K+r)")
    pipeline_parallel_size: int = option(1, short="-pp",
                                         help="pipeline stages of one model replica, each a tensor-parallel group of "
                                              "its own over a share of the layers: tp x pp ranks in all")
    pp_layer_partition: str = option("", help="each stage's number of layers, comma-separated in stage order (they "
                                              "sum to the model's layers); empty: as even as they divide")
    rank: int = 0  # this worker's rank in its replica: pipeline stage rank // tp, tensor-parallel rank rank % tp
    dist_init_address: str = ""  # HOST:PORT where rank 0 meets the other ranks (world_size > 1)
    enable_expert_parallel: bool = option(False, help="a mixture of experts' whole experts spread over the "
                                                       "tensor-parallel ranks, instead of every expert's "
                                                       "intermediate columns")
    dist_timeout: float = option(60.0, help="seconds a rank waits in a collective for the others before it fails")
    draft_model: str = option("", help="with --speculative-method draft: a smaller model of the same vocabulary "
                                       "that proposes tokens beside the target (a folder or .gguf file, or a shape "
                                       "name with --draft-load-format dummy)")
    draft_load_format: str = option("auto", choices=LOAD_FORMATS, help="--load-format of the draft model")
    kv_role: str = option("both", choices=KV_ROLES,
                          help="prefill or decode: a replica of a disaggregated pair, whose KV cache a NIXL agent "
                               "registers (the decode side pulls the prefill side's blocks); both: neither")

    def __post_init__(self):
        if self.tensor_parallel_size < 1 or self.pipeline_parallel_size < 1:
            raise ValueError("tensor_parallel_size and pipeline_parallel_size must be at least 1")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if self.world_size > 1 and not self.dist_init_address:
            raise ValueError("a worker of several ranks needs dist_init_address (HOST:PORT of rank 0)")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        for name in ("load_format", "draft_load_format"):
            if getattr(self, name) not in LOAD_FORMATS:
                raise ValueError(f"{name} must be 'auto' or 'dummy', got {getattr(self, name)!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {list(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype not in FP8_KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be 'auto', 'fp8' or 'fp8_e4m3', got {self.kv_cache_dtype!r}")
        if self.calculate_kv_scales and self.kv_cache_dtype == "auto":
            raise ValueError("calculate_kv_scales needs an FP8 KV cache (kv_cache_dtype 'fp8')")
        if self.kernels not in KERNELS:
            raise ValueError(f"kernels must be 'auto', 'triton' or 'torch', got {self.kernels!r}")
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_role must be one of {list(KV_ROLES)}, got {self.kv_role!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")

    @property
    def world_size(self) -> int:
        """The replica's ranks: tensor_parallel_size in each of pipeline_parallel_size stages."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def tensor_parallel_rank(self) -> int:
        return self.rank % self.tensor_parallel_size

    @property
    def pipeline_parallel_rank(self) -> int:
        return self.rank // self.tensor_parallel_size

    @property
    def kv_cache_bytes(self) -> int:
        return int(self.kv_cache_gib * (1 << 30))

    @property
    def kv_cache_dtype_name(self) -> str:
        """The KV cache's elements in --kv-cache-dtype's vocabulary, "auto" resolved to --dtype's."""
        return self.dtype if self.kv_cache_dtype == "auto" else self.kv_cache_dtype

    @property
    def torch_dtype(self):
        import torch  # here, not above: the CLI reads these settings in processes that load no model

        return getattr(torch, self.dtype)

    @property
    def kv_cache_torch_dtype(self):
        import torch

        return self.torch_dtype if self.kv_cache_dtype == "auto" else torch.float8_e4m3fn

    @property
    def uses_triton(self) -> bool:
        return self.kernels == "triton" or (self.kernels == "auto" and self.device.startswith("cuda"))
