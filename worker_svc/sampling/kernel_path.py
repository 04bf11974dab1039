"""Which tensors the sampler hands to its Triton kernels: CUDA ones (every CUDA build of torch brings Triton); the
CPU runs their plain-torch references. Asked in this one place, so that a test can send CPU tensors down the kernel
path, through Triton's interpreter."""
import torch


def runs_kernels(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda
