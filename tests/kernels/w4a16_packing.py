"""Our packers of known int4 values into each checkpoint format's tensors (GPTQ, AutoAWQ's GEMM packing,
compressed-tensors' pack-quantized): the kernels' converter tests and the worker's 4-bit checkpoints share them."""
import torch

from sluice.kernels.w4a16_layout import AWQ_ORDER, SYMMETRIC_ZERO, pack_int4


def wrapped(words: torch.Tensor) -> torch.Tensor:
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def to_gptq(q, z, scales, v1: bool):
    """Our GPTQ quantizer's packing: qweight along K, qzeros along N, v1 zero points minus one (borrows included)."""
    z = torch.full_like(scales, SYMMETRIC_ZERO, dtype=torch.int64) if z is None else z
    qzeros = pack_int4(z, 1)
    if v1:
        qzeros = wrapped(((qzeros.to(torch.int64) & 0xFFFFFFFF) - 0x11111111) % 2**32)
    return pack_int4(q, 0), qzeros


def to_awq(values: torch.Tensor) -> torch.Tensor:
    """AutoAWQ's packing along N: word c holds column 8c + AWQ_ORDER[i] at bits 4i."""
    order = (torch.arange(0, values.shape[1], 8)[:, None] + torch.tensor(AWQ_ORDER)).flatten()
    return pack_int4(values[:, order.to(values.device)], 1)


def to_compressed_tensors(q, z):
    """compressed-tensors' pack_to_int32: values signed in [-8, 7] (ours minus 8) stored plus 8, weights along K
    ([N, K / 8]), zero points along N padded to a multiple of 8 ([ceil(N / 8), G])."""
    packed = pack_int4(q.T, 1)
    if z is None:
        return packed, None
    return packed, pack_int4(torch.nn.functional.pad(z.T, (0, 0, 0, -z.shape[1] % 8)), 0)
