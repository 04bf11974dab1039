"""Shared pieces of the paged KV cache: the jitted tile gather used by both attention kernels, and launcher checks.

Layout (per layer): key_cache and value_cache are [num_blocks, block_size, num_kv_heads, head_dim]; a token's slot
id is block_id * block_size + offset; block_tables is int32 [num_seqs, max_blocks_per_seq], padded with 0.
"""
import torch
import triton
import triton.language as tl

ATTENTION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def kv_tile_offsets(block_table_row_ptr, pos, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
    """Element offsets (int64) of the cache rows holding context positions `pos` of one sequence."""
    block_ids = tl.load(block_table_row_ptr + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    return block_ids * stride_block + (pos % BLOCK_SIZE) * stride_slot


def dot_config(dtype: torch.dtype, device: torch.device) -> tuple[tl.dtype, str]:
    """The dtype tl.dot multiplies in and its fp32 precision mode.

    NOTE: the Triton interpreter (CPU) runs tl.dot on bfloat16's raw bit patterns (triton-lang/triton#11584,
    "not supported yet"), so off CUDA every dot runs in fp32. On CUDA, 16-bit inputs go to the tensor cores as they
    are and fp32 inputs use exact "ieee" products rather than the default tf32.
    """
    if device.type != "cuda" or dtype == torch.float32:
        return tl.float32, "ieee"
    return (tl.bfloat16 if dtype == torch.bfloat16 else tl.float16), "tf32"


def check_paged_kv(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    """Validate what both attention launchers share: dtypes, devices, head counts and the cache layout."""
    if query.dtype not in ATTENTION_DTYPES:
        raise TypeError(f"query dtype {query.dtype} not in {ATTENTION_DTYPES}")
    if key_cache.dtype != query.dtype or value_cache.dtype != query.dtype:
        raise TypeError(f"cache dtypes {key_cache.dtype}/{value_cache.dtype} differ from query dtype {query.dtype}")
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(f"key/value cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
                         f"got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}")
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    if block_size & (block_size - 1):
        raise ValueError(f"block_size {block_size} is not a power of two")
    if query.dim() != 3 or query.shape[2] != head_dim:
        raise ValueError(f"query must be [tokens, num_heads, {head_dim}], got {tuple(query.shape)}")
    if query.shape[1] % num_kv_heads:
        raise ValueError(f"num_heads {query.shape[1]} is not a multiple of num_kv_heads {num_kv_heads}")
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim, strides {t.stride()}")
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.stride(1) != 1:
        raise ValueError(f"block_tables must be a row-contiguous int32 [num_seqs, max_blocks], got "
                         f"{block_tables.dtype} {tuple(block_tables.shape)}")
    if seq_lens.dtype != torch.int32 or seq_lens.shape != (block_tables.shape[0],) or not seq_lens.is_contiguous():
        raise ValueError(f"seq_lens must be contiguous int32 [{block_tables.shape[0]}], got "
                         f"{seq_lens.dtype} {tuple(seq_lens.shape)}")
    devices = {t.device for t in (query, key_cache, value_cache, block_tables, seq_lens)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")
