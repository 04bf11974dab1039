"""Rotary position embedding, NeoX / Llama "rotate_half" style, over a cos/sin table (sluice.worker.models.rope), of
each head's first rotary_dim dims (the table's width: all of them, or a partial rotary's share)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(x_ptr, token, stride_t, stride_h, cos, sin,
                  NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """In place on one token's [NUM_HEADS, 2 * HALF] rows: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < NUM_HEADS) & (i < HALF)
    first = x_ptr + token.to(tl.int64) * stride_t + h * stride_h + i
    x1 = tl.load(first, mask=mask, other=0.0)
    x2 = tl.load(first + HALF, mask=mask, other=0.0)
    y1 = x1.to(tl.float32) * cos - x2.to(tl.float32) * sin
    y2 = x2.to(tl.float32) * cos + x1.to(tl.float32) * sin
    tl.store(first, y1.to(x1.dtype), mask=mask)
    tl.store(first + HALF, y2.to(x1.dtype), mask=mask)


@triton.jit
def _rotary_embedding_kernel(
    positions_ptr, q_ptr, k_ptr, cos_sin_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_KV_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    """Program `token` rotates all its query and key heads in place by the angles of positions[token].

    cos_sin_cache row p holds cos(p * inv_freq) in its first half and sin(p * inv_freq) in its second; the rotation
    pairs dim i with dim i + HALF and runs in fp32, rounding once to the tensor dtype. Dims from 2 * HALF on (a partial
    rotary's) stay as they are.
    """
    token = tl.program_id(0)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)[None, :]
    cos = tl.load(cos_sin_ptr + pos * stride_cs + i, mask=i < HALF, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + i, mask=i < HALF, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, token, stride_qt, stride_qh, cos, sin, NUM_HEADS, HALF, BLOCK_H, BLOCK_HALF)
    _rotate_heads(k_ptr, token, stride_kt, stride_kh, cos, sin, NUM_KV_HEADS, HALF, BLOCK_KV_H, BLOCK_HALF)


def rotary_embedding(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
) -> None:
    """In place: rotate query [num_tokens, num_heads, head_dim] and key [num_tokens, num_kv_heads, head_dim].

    positions: int32/int64 [num_tokens]; cos_sin_cache: [max_position, rotary_dim] from build_cos_sin_cache, an even
    rotary_dim <= head_dim: the leading dims of each head that rotate. query and key may be strided views (e.g. of a
    fused qkv output) as long as head_dim is contiguous.
    """
    num_tokens, num_heads, head_dim = query.shape
    if key.dim() != 3 or key.shape[0] != num_tokens or key.shape[2] != head_dim:
        raise ValueError(f"key {tuple(key.shape)} does not match query {tuple(query.shape)}")
    check_cos_sin_cache(cos_sin_cache, head_dim)
    if positions.dtype not in (torch.int32, torch.int64) or positions.shape != (num_tokens,):
        raise ValueError(f"positions must be int [{num_tokens}], got {positions.dtype} {tuple(positions.shape)}")
    if query.dtype != key.dtype:
        raise TypeError(f"query {query.dtype} and key {key.dtype} differ")
    for name, t in (("query", query), ("key", key), ("cos_sin_cache", cos_sin_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim, strides {t.stride()}")
    if num_tokens == 0:
        return
    half = cos_sin_cache.shape[1] // 2
    _rotary_embedding_kernel[(num_tokens,)](
        positions, query, key, cos_sin_cache,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), cos_sin_cache.stride(0),
        NUM_HEADS=num_heads, NUM_KV_HEADS=key.shape[1], HALF=half,
        BLOCK_H=triton.next_power_of_2(num_heads), BLOCK_KV_H=triton.next_power_of_2(key.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(half),
    )


def rotary_embedding_ref(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
) -> None:
    """Plain torch, in place, op for op as Hugging Face's apply_rotary_pos_emb (in the tensors' dtype), Phi-3's with a
    partial rotary."""
    cos, sin = cos_sin_cache[positions.long()].to(query.dtype).chunk(2, dim=-1)  # [num_tokens, rotary_dim / 2] each
    cos = torch.cat((cos, cos), dim=-1)[:, None, :]
    sin = torch.cat((sin, sin), dim=-1)[:, None, :]
    rotary_dim = cos_sin_cache.shape[1]
    for x in (query[..., :rotary_dim], key[..., :rotary_dim]):
        x1, x2 = x.chunk(2, dim=-1)
        x.copy_(x * cos + torch.cat((-x2, x1), dim=-1) * sin)


def check_cos_sin_cache(cos_sin_cache: torch.Tensor, head_dim: int) -> None:
    """cos_sin_cache: [max_position, rotary_dim] for an even rotary_dim of at most head_dim."""
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] % 2 or not 0 < cos_sin_cache.shape[1] <= head_dim:
        raise ValueError(f"cos_sin_cache must be [max_position, rotary_dim] for an even rotary_dim <= head_dim "
                         f"{head_dim}, got {tuple(cos_sin_cache.shape)}")
