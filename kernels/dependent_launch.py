"""Programmatic dependent launch (Hopper and newer): a kernel launched with it may start while the kernel before it in
the stream is still finishing, so in a CUDA graph of a decode step the launch latency between two of its 200-odd
small kernels overlaps the previous one's tail. A kernel that takes it calls `wait_for_inputs` before it reads or
writes anything the kernels before it touch (it may read what no kernel writes, such as weights, before); the wait
also lets the kernel after it start launching. Each launcher that uses it takes `pdl` (the worker's
--no-dependent-launch turns it off)."""
import functools

import torch
import triton
import triton.language as tl


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@functools.cache
def _supported(device_index: int) -> bool:
    from triton.language.extra import cuda

    return hasattr(cuda, "gdc_wait") and torch.cuda.get_device_capability(device_index) >= (9, 0)


def dependent_launch(device: torch.device, wanted: bool = True) -> dict:
    """A launch's options: the kernel's PDL flag and Triton's launch_pdl, on where wanted and the device supports it."""
    enabled = wanted and device.type == "cuda" and _supported(device.index if device.index is not None else 0)
    return dict(PDL=enabled, launch_pdl=True) if enabled else dict(PDL=False)
