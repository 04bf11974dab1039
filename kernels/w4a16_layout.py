"""Sluice's one layout of 4-bit weights (W4A16: int4 weights, 16-bit or float32 activations), and converters into it
from the three checkpoint formats that carry them: GPTQ, AWQ (its GEMM packing) and compressed-tensors'
pack-quantized. Each converter has a plain-torch twin that dequantizes the checkpoint's own tensors, which the tests
hold the converted weight to.

The layout (W4A16Weight), for a linear layer of K inputs and N outputs (nn.Linear's weight is [N, K]):
- qweight int32 [K / 8, N]: eight unsigned 4-bit values q in [0, 15] a word along K, input k at bits 4 * (k % 8) of
  word k // 8 (GPTQ's qweight as stored). Along K because the kernels' K slices then read whole words, and N is
  contiguous so a slice's words load coalesced.
- scales [K / group, N], in the activation dtype; zeros uint8 [K / group, N], unpacked (1/64 of the weight's bytes
  at groups of 128), or None for symmetric weights, whose zero point is 8. W[n, k] = (q - zero) * scale of k's group.
- perm int32 [K] or None: with GPTQ's act-order (desc_act) a group's inputs are scattered over K; the converters sort
  the rows by group, so row j of the layout holds input perm[j] and groups are contiguous again: y = x[:, perm] @ W,
  the kernels reading x's columns through perm.
- group_index int32 [K] or None: the group of each row, for a tensor-parallel rank's share of an act-order weight's
  inputs (a row-parallel projection's): its rows are a run of the whole weight's inputs in their own order, whose
  groups are scattered over all of them, so the rank keeps every group's scales and zero points and the kernels look
  each row's up. Without it, row j lies in group j // (K / G).
The group size, K / G, is a multiple of 16 (the GEMM's K slices lie within a group and hold at least 16); one
group over all of K is per-channel quantization (GPTQ's group_size -1). With group_index K is a multiple of 16.
"""
from dataclasses import dataclass

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AWQ's word holds columns 8c + AWQ_ORDER[i] at bits 4i
SYMMETRIC_ZERO = 8
_GPTQ_V1_OFFSET = 0x11111111  # GPTQ v1 stores each zero point minus one, borrows included


@dataclass(slots=True)
class W4A16Weight:
    qweight: torch.Tensor  # int32 [K / 8, N]: q of input k at bits 4 * (k % 8) of word k // 8
    scales: torch.Tensor  # [K / group, N], the activation dtype
    zeros: torch.Tensor | None  # uint8 [K / group, N]; None: 8 (symmetric)
    perm: torch.Tensor | None  # int32 [K]: row j holds input perm[j]; None: the identity
    group_index: torch.Tensor | None = None  # int32 [K]: row j lies in group group_index[j]; None: j // group_size

    def __post_init__(self):
        k8, n = self.qweight.shape
        groups = self.scales.shape[0]
        if self.qweight.dtype != torch.int32 or self.scales.shape != (groups, n) or \
                self.group_index is None and (8 * k8) % groups:
            raise ValueError(f"qweight {self.qweight.dtype} {tuple(self.qweight.shape)} and scales "
                             f"{tuple(self.scales.shape)} are no [K / 8, N] int32 words and [K / group, N] scales")
        if self.slice_rows % 16:
            raise ValueError(f"the group size (K, with group_index) must be a multiple of 16, got {self.slice_rows}")
        if self.zeros is not None and (self.zeros.dtype != torch.uint8 or self.zeros.shape != self.scales.shape):
            raise ValueError(f"zeros must be uint8 {tuple(self.scales.shape)}, got {self.zeros.dtype} "
                             f"{tuple(self.zeros.shape)}")
        for name, index in (("perm", self.perm), ("group_index", self.group_index)):
            if index is not None and (index.dtype != torch.int32 or index.shape != (8 * k8,)):
                raise ValueError(f"{name} must be int32 [{8 * k8}]")
        if self.perm is not None and self.group_index is not None:
            raise ValueError("a W4A16 weight's rows are sorted by group (perm) or name their groups (group_index), "
                             "not both")
        if not all(t.is_contiguous() for t in (self.qweight, self.scales, self.zeros, self.perm, self.group_index)
                   if t is not None):
            raise ValueError("a W4A16 weight's tensors must be contiguous")

    @property
    def in_features(self) -> int:
        return 8 * self.qweight.shape[0]

    @property
    def out_features(self) -> int:
        return self.qweight.shape[1]

    @property
    def group_size(self) -> int:
        """The inputs of a group, without group_index."""
        return self.in_features // self.scales.shape[0]

    @property
    def slice_rows(self) -> int:
        """The run of rows that a kernel's K slice lies within: a group, or with group_index (each row's group
        looked up) all of K."""
        return self.in_features if self.group_index is not None else self.group_size


@dataclass(slots=True)
class W4A16Stack:
    """A mixture's experts' weights of one projection, stacked: expert e's W4A16Weight is (qweight[e], scales[e],
    zeros[e], perm[e], group_index[e]). The grouped GEMMs read expert e's words [K / 8, N] as the dense GEMM reads a
    weight's, at an offset of e words-per-expert, and with act-order its inputs through its own permutation or its
    rows' groups through its own group_index."""
    qweight: torch.Tensor  # int32 [E, K / 8, N]
    scales: torch.Tensor  # [E, K / group, N], the activation dtype
    zeros: torch.Tensor | None  # uint8 [E, K / group, N]; None: 8 (symmetric)
    perm: torch.Tensor | None = None  # int32 [E, K]: expert e's row j holds input perm[e, j]; None: the identity
    group_index: torch.Tensor | None = None  # int32 [E, K]: expert e's row j lies in group group_index[e, j]

    def __post_init__(self):
        if self.qweight.dim() != 3 or self.scales.dim() != 3 or self.qweight.shape[0] != self.scales.shape[0]:
            raise ValueError(f"qweight {tuple(self.qweight.shape)} and scales {tuple(self.scales.shape)} are no "
                             "[E, K / 8, N] and [E, K / group, N] stacks")
        self.expert(0)  # an expert's tensors are a W4A16Weight's
        if not all(t.is_contiguous() for t in (self.qweight, self.scales, self.zeros, self.perm, self.group_index)
                   if t is not None):
            raise ValueError("a W4A16 stack's tensors must be contiguous")

    def expert(self, index: int) -> W4A16Weight:
        return W4A16Weight(self.qweight[index], self.scales[index], *(None if t is None else t[index]
                                                                      for t in (self.zeros, self.perm,
                                                                                self.group_index)))

    @property
    def shape(self) -> tuple[int, int, int]:
        """[E, N, K]: the unquantized stack's (nn.Linear's weight per expert)."""
        experts, k8, n = self.qweight.shape
        return experts, n, 8 * k8

    @property
    def slice_rows(self) -> int:
        """An expert's W4A16Weight.slice_rows."""
        k = 8 * self.qweight.shape[1]
        return k if self.group_index is not None else k // self.scales.shape[1]


def stack(weights: list[W4A16Weight]) -> W4A16Stack:
    """The experts' weights (one projection each, of one group size, all with zero points or none, all with act-order
    or none, all with group_index or none) stacked."""
    return W4A16Stack(*(None if getattr(weights[0], kind) is None else torch.stack([getattr(w, kind) for w in weights])
                        for kind in ("qweight", "scales", "zeros", "perm", "group_index")))


def dequantize_stack(weights: W4A16Stack) -> torch.Tensor:
    """The [E, N, K] stack of each expert's dequantized weight: the grouped GEMMs' reference."""
    return torch.stack([dequantize(weights.expert(e)) for e in range(weights.shape[0])])


def pack_int4(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Integers in [0, 15] -> int32 words of eight along dim (a multiple of 8 long), value i at bits 4i."""
    values = values.movedim(dim, -1).to(torch.int64)
    shifts = 4 * torch.arange(8, device=values.device)
    words = (values.unflatten(-1, (-1, 8)) << shifts).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).movedim(-1, dim).contiguous()


def unpack_int4(words: torch.Tensor, dim: int) -> torch.Tensor:
    """pack_int4's inverse: int32 words -> int32 values in [0, 15], eight times as many along dim."""
    shifts = 4 * torch.arange(8, device=words.device, dtype=torch.int32)
    values = (words.movedim(dim, -1)[..., None] >> shifts) & 0xF
    return values.flatten(-2).movedim(-1, dim)


def dequantize(weight: W4A16Weight) -> torch.Tensor:
    """The [N, K] weight, in the scales' dtype and the inputs' own order: the kernels' reference."""
    groups = weight.group_index.long() if weight.group_index is not None else \
        torch.arange(weight.in_features, device=weight.qweight.device) // weight.group_size
    zeros = SYMMETRIC_ZERO if weight.zeros is None else weight.zeros.to(torch.int32)[groups]
    w = (unpack_int4(weight.qweight, 0) - zeros).to(weight.scales.dtype) * weight.scales[groups]
    if weight.perm is not None:
        w = torch.empty_like(w).index_copy_(0, weight.perm.long(), w)
    return w.T


def input_run(weight: W4A16Weight, start: int, stop: int) -> W4A16Weight:
    """Inputs start to stop (multiples of 8) of weight, in their own order, each row naming its group (group_index),
    with every group's scales and zero points: a tensor-parallel rank's share of a row-parallel act-order weight."""
    rows = torch.arange(weight.in_features, device=weight.qweight.device)
    if weight.perm is not None:  # the layout row that holds each input
        rows = torch.empty_like(rows).index_copy_(0, weight.perm.long(), rows)
    held = rows[start:stop]
    groups = weight.group_index[held] if weight.group_index is not None else held // weight.group_size
    return W4A16Weight(pack_int4(unpack_int4(weight.qweight, 0)[held], 0), weight.scales, weight.zeros, None,
                       groups.to(torch.int32))


def round_to_nearest(weight: torch.Tensor, group: int, sym: bool, g_idx: torch.Tensor | None = None,
                     scale_dtype: torch.dtype | None = None):
    """Round to nearest of weight [N, K] (nn.Linear's) in groups of `group` inputs: (q [K, N] in [0, 15], zero points
    [G, N] or None (sym: 8), scales [G, N] in scale_dtype, the weight's by default), each group's scale from its
    absolute maximum (sym) or its range. g_idx [K]: the group of each input; None: inputs in order."""
    wt = weight.T.float()
    k, n = wt.shape
    groups = torch.arange(k, device=wt.device) // group if g_idx is None else g_idx.long()
    shape, index = (k // group, n), groups[:, None].expand_as(wt)
    high = torch.full(shape, -torch.inf, device=wt.device).scatter_reduce(0, index, wt, "amax")
    low = torch.full(shape, torch.inf, device=wt.device).scatter_reduce(0, index, wt, "amin")
    if sym:
        scales, zeros = (torch.maximum(high, -low) / 7).clamp_min(1e-6).to(scale_dtype or weight.dtype), None
        z = torch.full(shape, SYMMETRIC_ZERO, device=wt.device)
    else:
        scales = ((high - low) / 15).clamp_min(1e-6).to(scale_dtype or weight.dtype)
        zeros = z = (-low / scales.float()).round().clamp(0, 15).long()
    q = (wt / scales.float()[groups]).round().long().add(z[groups]).clamp(0, 15)
    return q, zeros, scales


def quantize(weight: torch.Tensor, group: int, sym: bool) -> W4A16Weight:
    """weight [N, K] rounded to nearest (round_to_nearest) in the layout, its inputs in order."""
    q, zeros, scales = round_to_nearest(weight, group, sym)
    return _canonical(q, scales, zeros, None, None)


def _canonical(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, g_idx: torch.Tensor | None,
               dtype: torch.dtype | None) -> W4A16Weight:
    """The layout of q [K, N] in [0, 15], scales and zeros [G, N] (zeros in [0, 15]) and the group of each input
    (g_idx [K]; None: inputs in order), rows sorted by group where g_idx scatters them."""
    k, groups = q.shape[0], scales.shape[0]
    perm = None
    if g_idx is not None:
        in_order = torch.arange(k, device=q.device) // (k // groups)
        if not torch.equal(g_idx.long(), in_order):
            perm = torch.sort(g_idx.long(), stable=True).indices
            if not torch.equal(g_idx.long()[perm], in_order):
                raise ValueError(f"g_idx must give each of the {groups} groups {k // groups} inputs")
            q, perm = q[perm], perm.to(torch.int32)
    return W4A16Weight(pack_int4(q, 0), scales.to(dtype or scales.dtype).contiguous(),
                       None if zeros is None else zeros.to(torch.uint8).contiguous(), perm)


def _gptq_zeros(qzeros: torch.Tensor, n: int, v1: bool) -> torch.Tensor:
    words = qzeros.to(torch.int64) & 0xFFFFFFFF
    if v1:
        words = (words + _GPTQ_V1_OFFSET) & 0xFFFFFFFF
    return unpack_int4(torch.where(words >= 2**31, words - 2**32, words).to(torch.int32), 1)[:, :n]


def from_gptq(qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor | None = None,
              g_idx: torch.Tensor | None = None, *, sym: bool = True, v1: bool = True,
              dtype: torch.dtype | None = None) -> W4A16Weight:
    """GPTQ (AutoGPTQ, GPTQModel): qweight int32 [K / 8, N] packed along K as our layout, scales [G, N], qzeros int32
    [G, N / 8] packed along N in the same bit order, g_idx [K] the group of each input (act-order scatters them).
    v1 (checkpoint_format "gptq") stores each zero point minus one, as one subtraction of 0x11111111 from the word
    (GPTQModel converts to v2 by adding it back); "gptq_v2" stores them as they are. sym: the zero point is 8, and
    qzeros (v1's 0x77777777 words) is not read. dtype: the scales' (the activations'), theirs by default."""
    zeros = None if sym else _gptq_zeros(qzeros, qweight.shape[1], v1)
    return _canonical(unpack_int4(qweight, 0), scales, zeros, g_idx, dtype)


def gptq_dequantize_ref(qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor | None = None,
                        g_idx: torch.Tensor | None = None, *, sym: bool = True, v1: bool = True) -> torch.Tensor:
    """GPTQ's own dequantization: W[n, k] = (q[k, n] - zero[g, n]) * scales[g, n], g = g_idx[k]; [N, K]."""
    k = 8 * qweight.shape[0]
    groups = g_idx.long() if g_idx is not None else torch.arange(k, device=qweight.device) // (k // scales.shape[0])
    zeros = SYMMETRIC_ZERO if sym else _gptq_zeros(qzeros, qweight.shape[1], v1)[groups]
    return ((unpack_int4(qweight, 0) - zeros).to(scales.dtype) * scales[groups]).T


def _unpack_awq(words: torch.Tensor) -> torch.Tensor:
    """AWQ's int32 [R, N / 8] -> [R, N]: word c's value i is column 8c + AWQ_ORDER[i]."""
    values = unpack_int4(words, 1).unflatten(1, (-1, 8))
    return torch.empty_like(values).index_copy_(2, torch.tensor(AWQ_ORDER, device=words.device), values).flatten(1)


def from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
             dtype: torch.dtype | None = None) -> W4A16Weight:
    """AWQ's GEMM packing (AutoAWQ, llm-awq): qweight int32 [K, N / 8] and qzeros [G, N / 8] packed along N, word c
    holding columns 8c + (0, 2, 4, 6, 1, 3, 5, 7) at bits 0, 4, ..., 28; scales [G, N]; zero points as stored."""
    return _canonical(_unpack_awq(qweight), scales, _unpack_awq(qzeros), None, dtype)


def awq_dequantize_ref(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    group = qweight.shape[0] // scales.shape[0]
    q = _unpack_awq(qweight) - _unpack_awq(qzeros).repeat_interleave(group, 0)
    return (q.to(scales.dtype) * scales.repeat_interleave(group, 0)).T


def from_compressed_tensors(weight_packed: torch.Tensor, weight_scale: torch.Tensor,
                            weight_zero_point: torch.Tensor | None = None, weight_g_idx: torch.Tensor | None = None,
                            dtype: torch.dtype | None = None) -> W4A16Weight:
    """compressed-tensors' pack-quantized int4 (llm-compressor's W4A16): weight_packed int32 [N, K / 8] packed along
    K, value i at bits 4i; weight_scale [N, G]; weight_zero_point (asymmetric only) int32 [ceil(N / 8), G] packed
    along N the same way; weight_g_idx [K] (actorder). Values and zero points are signed in [-8, 7], stored plus 8:
    (q - zp) is the same for the stored nibbles, which are our q and zeros."""
    n = weight_packed.shape[0]
    zeros = None if weight_zero_point is None else unpack_int4(weight_zero_point, 0)[:n].T
    return _canonical(unpack_int4(weight_packed, 1).T, weight_scale.T, zeros, weight_g_idx, dtype)


def compressed_tensors_dequantize_ref(weight_packed: torch.Tensor, weight_scale: torch.Tensor,
                                      weight_zero_point: torch.Tensor | None = None,
                                      weight_g_idx: torch.Tensor | None = None) -> torch.Tensor:
    n, k = weight_packed.shape[0], 8 * weight_packed.shape[1]
    groups = (weight_g_idx.long() if weight_g_idx is not None
              else torch.arange(k, device=weight_packed.device) // (k // weight_scale.shape[1]))
    q = unpack_int4(weight_packed, 1) - 8
    zp = 0 if weight_zero_point is None else unpack_int4(weight_zero_point, 0)[:n][:, groups] - 8
    return (q - zp).to(weight_scale.dtype) * weight_scale[:, groups]
