"""One K slice of a 4-bit weight (kernels.w4a16_layout's layout) dequantized in registers, and the input columns it
multiplies: the tiles that the dense W4A16 GEMM (kernels.w4a16) and the fused MoE GEMMs over stacked 4-bit experts
(kernels.fused_moe) feed to tl.dot."""
import triton
import triton.language as tl

from sluice.kernels.w4a16_layout import SYMMETRIC_ZERO

_SYMMETRIC_ZERO = tl.constexpr(SYMMETRIC_ZERO)


@triton.jit
def dequantized_tile(word_cols, scale_cols, zero_cols, row_groups, k, stride_words, stride_groups,
                     HAS_ZEROS: tl.constexpr, HAS_GROUP_INDEX: tl.constexpr, GROUP: tl.constexpr,
                     BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """W.T[k : k + BLOCK_K, cols] in the scales' dtype: [BLOCK_K, BLOCK_N], the slice within one group, or with
    HAS_GROUP_INDEX each row in the group that row_groups (the layout's group_index) names.
    word_cols [1, BLOCK_N]: pointers to the columns' words of row 0 (rows stride_words apart); scale_cols and
    zero_cols [BLOCK_N]: to the columns' scales and zero points of group 0 (groups stride_groups apart)."""
    words = tl.load(word_cols + (k // 8 + tl.arange(0, BLOCK_K // 8))[:, None] * stride_words)
    q = (words[:, None, :] >> (4 * tl.arange(0, 8))[None, :, None]) & 0xF  # [BLOCK_K / 8, 8, BLOCK_N]
    q = tl.reshape(q, [BLOCK_K, BLOCK_N])
    if HAS_GROUP_INDEX:  # each row's group: [BLOCK_K, BLOCK_N] scales and zero points
        group = tl.load(row_groups + k + tl.arange(0, BLOCK_K))[:, None] * stride_groups
        scale_ptrs, zero_ptrs = scale_cols[None, :] + group, zero_cols[None, :] + group
    else:  # the slice's group: [1, BLOCK_N]
        group = k // GROUP * stride_groups
        scale_ptrs, zero_ptrs = (scale_cols + group)[None, :], (zero_cols + group)[None, :]
    if HAS_ZEROS:
        q -= tl.load(zero_ptrs).to(tl.int32)
    else:
        q -= _SYMMETRIC_ZERO
    scale = tl.load(scale_ptrs)
    return (q.to(tl.float32) * scale.to(tl.float32)).to(scale.dtype)  # exact, then rounded once


@triton.jit
def input_columns(perm_ptr, ks, HAS_PERM: tl.constexpr):
    """The columns of x that the layout's rows ks multiply: perm[ks] when the rows are sorted by group."""
    if HAS_PERM:
        return tl.load(perm_ptr + ks)
    return ks
