from dataclasses import dataclass

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_KV_CACHE_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}  # and "auto": the model dtype


@dataclass(slots=True)
class WorkerConfig:
    model: str  # a Hugging Face folder, a .gguf file, or a shape name with load_format "dummy"
    load_format: str = "auto"  # "auto" (folder or .gguf) or "dummy" (random weights of a named shape)
    dtype: str = "float32"
    quantization: str = "auto"  # "auto": as the checkpoint stores it; "fp8": decoder projections in e4m3 (fp8.py)
    kv_cache_dtype: str = "auto"  # "auto": the model dtype; "fp8" / "fp8_e4m3": e4m3 with per-layer scales
    calculate_kv_scales: bool = False  # an FP8 KV cache's scales from the first step (runner/kv_scale_calibration.py)
    device: str = "cpu"
    kv_cache_bytes: int = 1 << 30  # the CPU budget for the KV cache
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False  # no CUDA graphs, and every step builds its inputs on the host
    kernels: str = "auto"  # "auto" (Triton on a GPU, torch on the CPU), "triton" or "torch"
    seed: int = 0
    tensor_parallel_size: int = 1
    rank: int = 0  # this worker's tensor-parallel rank
    dist_init_address: str = ""  # HOST:PORT where rank 0 meets the other ranks (tensor_parallel_size > 1)
    dist_timeout: float = 60.0  # seconds a collective may wait for the other ranks before the worker fails
    draft_model: str = ""  # speculative method "draft": a smaller model of the same vocabulary (as `model` names it)
    draft_load_format: str = "auto"

    def __post_init__(self):
        if not 0 <= self.rank < self.tensor_parallel_size:
            raise ValueError(f"rank must be in [0, {self.tensor_parallel_size}), got {self.rank}")
        if self.tensor_parallel_size > 1 and not self.dist_init_address:
            raise ValueError("a tensor-parallel worker needs dist_init_address (HOST:PORT of rank 0)")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        for name in ("load_format", "draft_load_format"):
            if getattr(self, name) not in ("auto", "dummy"):
                raise ValueError(f"{name} must be 'auto' or 'dummy', got {getattr(self, name)!r}")
        if self.quantization not in ("auto", "fp8"):
            raise ValueError(f"quantization must be 'auto' or 'fp8', got {self.quantization!r}")
        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype not in _KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be 'auto', 'fp8' or 'fp8_e4m3', got {self.kv_cache_dtype!r}")
        if self.calculate_kv_scales and self.kv_cache_dtype == "auto":
            raise ValueError("calculate_kv_scales needs an FP8 KV cache (kv_cache_dtype 'fp8')")
        if self.kernels not in ("auto", "triton", "torch"):
            raise ValueError(f"kernels must be 'auto', 'triton' or 'torch', got {self.kernels!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def kv_cache_torch_dtype(self) -> torch.dtype:
        return _KV_CACHE_DTYPES.get(self.kv_cache_dtype, self.torch_dtype)

    @property
    def uses_triton(self) -> bool:
        return self.kernels == "triton" or (self.kernels == "auto" and self.device.startswith("cuda"))
