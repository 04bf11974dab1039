"""Tokens sorted and padded per expert for the grouped GEMMs of kernels.fused_moe (vLLM's moe_align_block_size).

A (token, slot) pair of the router's top-k is numbered pair = token * top_k + slot. The pairs routed to each local
expert are listed together, in pair order, each expert's run padded with the sentinel num_pairs to a multiple of
block_m, so every block of block_m rows belongs to one expert; experts that receive no pair get no block, and pairs
whose expert lives on another rank (expert_map -1) are dropped. Counting sort on the device, no host sync: the sizes
of the outputs depend only on the number of pairs, the number of experts and block_m (CUDA graphs replay them).
"""
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from sluice.kernels.dependent_launch import dependent_launch, wait_for_inputs


class ExpertBlocks(NamedTuple):
    """The pairs of one MoE step, grouped into blocks of block_m rows that each belong to one expert; or with
    one_pair_each (pair_blocks), block b holds pair b alone in its first row."""
    sorted_ids: torch.Tensor | None  # int32 [max_blocks * block_m]: pair ids by expert, runs padded with num_pairs
    block_experts: torch.Tensor  # int32 [max_blocks]: each block's local expert, -1 past the last block in use
    num_padded: torch.Tensor | None  # int32 [1]: rows in use, a multiple of block_m; rows past it are not written
    block_m: int
    one_pair_each: bool = False


def pair_blocks(topk_ids: torch.Tensor, block_m: int) -> ExpertBlocks:
    """Each pair its own block, in pair order (vLLM's naive block assignment): nothing to sort and nothing to launch.
    For steps whose pairs mostly go to different experts (a decode step of a few tokens over many experts), where
    sorted blocks would hold one pair each as well; ids are local experts."""
    _check(topk_ids, 1, block_m, None)
    return ExpertBlocks(None, topk_ids.reshape(-1), None, block_m, one_pair_each=True)


@triton.jit
def _chunk_one_hot(topk_ids_ptr, expert_map_ptr, chunk, num_pairs, num_experts,
                   HAS_MAP: tl.constexpr, CHUNK: tl.constexpr, BLOCK_E: tl.constexpr):
    """(pairs [CHUNK], one_hot [CHUNK, BLOCK_E]): the chunk's pair ids and which local expert each goes to (no
    column for a pair past the end or on another rank)."""
    pairs = chunk * CHUNK + tl.arange(0, CHUNK)
    valid = pairs < num_pairs
    experts = tl.load(topk_ids_ptr + pairs, mask=valid, other=-1)
    if HAS_MAP:
        experts = tl.load(expert_map_ptr + experts, mask=valid, other=-1)
    cols = tl.arange(0, BLOCK_E)
    one_hot = (experts[:, None] == cols[None, :]) & (cols < num_experts)[None, :] & valid[:, None]
    return pairs, one_hot


@triton.jit(do_not_specialize=["num_pairs"])
def _moe_align_count_kernel(topk_ids_ptr, expert_map_ptr, counts_ptr, num_pairs, num_experts,
                            HAS_MAP: tl.constexpr, CHUNK: tl.constexpr, BLOCK_E: tl.constexpr, PDL: tl.constexpr):
    """Program `chunk` stores how many of its CHUNK pairs go to each expert: counts[chunk, :]."""
    wait_for_inputs(PDL)
    chunk = tl.program_id(0)
    _, one_hot = _chunk_one_hot(topk_ids_ptr, expert_map_ptr, chunk, num_pairs, num_experts,
                                HAS_MAP, CHUNK, BLOCK_E)
    tl.store(counts_ptr + chunk * BLOCK_E + tl.arange(0, BLOCK_E), tl.sum(one_hot.to(tl.int32), 0))


@triton.jit(do_not_specialize=["num_pairs", "num_chunks", "max_blocks"])
def _moe_align_kernel(
    topk_ids_ptr, expert_map_ptr, counts_ptr, sorted_ids_ptr, block_experts_ptr, num_padded_ptr,
    num_pairs, num_experts, num_chunks, max_blocks,
    HAS_MAP: tl.constexpr, ONE_CHUNK: tl.constexpr, CHUNK: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_M: tl.constexpr, TABLE_ROWS: tl.constexpr, LABEL_BLOCKS: tl.constexpr, PDL: tl.constexpr,
):
    """Program `chunk` places its CHUNK pairs, then labels every num_chunks-th group of LABEL_BLOCKS blocks.

    Expert e's run starts at starts[e], the exclusive prefix sum of the padded counts. A pair's row is starts[e]
    + (pairs of e in earlier chunks, summed from the count table) + (pairs of e before it in its chunk: the
    running sum of the one-hot column). With ONE_CHUNK (a decode step) the chunk's own counts are the totals and no
    count kernel runs before. Block b belongs to the expert whose padded run [start, end) holds row b * BLOCK_M;
    rows of that block past the expert's last pair get the sentinel num_pairs. Program 0 stores the rows in use.
    """
    wait_for_inputs(PDL)
    chunk = tl.program_id(0)
    cols = tl.arange(0, BLOCK_E)
    pairs, one_hot = _chunk_one_hot(topk_ids_ptr, expert_map_ptr, chunk, num_pairs, num_experts,
                                    HAS_MAP, CHUNK, BLOCK_E)
    hot = one_hot.to(tl.int32)

    # -- pairs per expert in all chunks and in the chunks before this one
    if ONE_CHUNK:
        totals = tl.sum(hot, 0)
        before = tl.zeros([BLOCK_E], tl.int32)
    else:
        totals = tl.zeros([BLOCK_E], tl.int32)
        before = tl.zeros([BLOCK_E], tl.int32)
        for c0 in range(0, num_chunks, TABLE_ROWS):
            c = c0 + tl.arange(0, TABLE_ROWS)
            table = tl.load(counts_ptr + c[:, None] * BLOCK_E + cols[None, :], mask=(c < num_chunks)[:, None],
                            other=0)
            totals += tl.sum(table, 0)
            before += tl.sum(tl.where((c < chunk)[:, None], table, 0), 0)
    padded = tl.cdiv(totals, BLOCK_M) * BLOCK_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded

    # -- each routed pair's row
    rank = tl.sum(tl.where(one_hot, tl.cumsum(hot, 0), 0), 1) - 1
    base = tl.sum(tl.where(one_hot, (starts + before)[None, :], 0), 1)
    tl.store(sorted_ids_ptr + base + rank, pairs, mask=tl.sum(hot, 1) > 0)

    # -- label blocks with their expert and fill their padding rows
    if chunk == 0:
        tl.store(num_padded_ptr, tl.sum(padded, 0))
    filled = starts + totals
    for b0 in range(chunk * LABEL_BLOCKS, max_blocks, num_chunks * LABEL_BLOCKS):
        blocks = b0 + tl.arange(0, LABEL_BLOCKS)
        first_row = blocks * BLOCK_M
        owns = (first_row[:, None] >= starts[None, :]) & (first_row[:, None] < ends[None, :])
        expert = tl.max(tl.where(owns, cols[None, :], -1), 1)
        tl.store(block_experts_ptr + blocks, expert, mask=blocks < max_blocks)
        run_filled = tl.sum(tl.where(owns, filled[None, :], 0), 1)
        rows = first_row[:, None] + tl.arange(0, BLOCK_M)[None, :]
        is_padding = (rows >= run_filled[:, None]) & (expert >= 0)[:, None]
        tl.store(sorted_ids_ptr + rows, tl.full([LABEL_BLOCKS, BLOCK_M], 0, tl.int32) + num_pairs,
                 mask=is_padding)


def max_padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Rows the sorted list can need: each expert that receives a pair (at most min(experts, pairs) of them) pads
    its run by fewer than block_m rows."""
    return triton.cdiv(num_pairs + min(num_experts, num_pairs) * (block_m - 1), block_m) * block_m


def _check(topk_ids: torch.Tensor, num_experts: int, block_m: int, expert_map: torch.Tensor | None) -> None:
    if topk_ids.dim() != 2 or topk_ids.dtype != torch.int32:
        raise ValueError(f"topk_ids must be int32 [num_tokens, top_k], got {topk_ids.dtype} {tuple(topk_ids.shape)}")
    if block_m < 1 or block_m & (block_m - 1):
        raise ValueError(f"block_m {block_m} is not a power of two")
    if num_experts < 1:
        raise ValueError(f"num_experts {num_experts} < 1")
    if expert_map is not None and (expert_map.dim() != 1 or expert_map.dtype != torch.int32
                                   or expert_map.device != topk_ids.device):
        raise ValueError(f"expert_map must be int32 [global_experts] on {topk_ids.device}")


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int,
                         expert_map: torch.Tensor | None = None, chunk: int | None = None,
                         pdl: bool = True) -> ExpertBlocks:
    """The pairs of topk_ids (int32 [T, k], global expert ids) sorted by local expert into blocks of block_m rows.

    num_experts: the local experts; expert_map (int32 [global experts]) maps a global id to its local one, -1 for
    an expert on another rank (those pairs are dropped); None: ids are local. chunk: pairs a program places (a
    power of two; None picks one), for tests of the multi-chunk path on small inputs.
    """
    _check(topk_ids, num_experts, block_m, expert_map)
    ids = topk_ids.reshape(-1)
    num_pairs = ids.numel()
    rows = max_padded_rows(num_pairs, num_experts, block_m)
    device = ids.device
    sorted_ids = torch.empty(rows, dtype=torch.int32, device=device)
    block_experts = torch.empty(rows // block_m, dtype=torch.int32, device=device)
    if num_pairs == 0:
        return ExpertBlocks(sorted_ids, block_experts, torch.zeros(1, dtype=torch.int32, device=device), block_m)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)  # program 0 stores it: no memset to launch
    block_e = triton.next_power_of_2(num_experts)
    # NOTE: the one-hot [chunk, experts] tile holds at most 16K elements (128 pairs of 128 experts), so a decode
    # step up to 16 tokens of top-8 is one launch of one program; larger steps count first. Not measured on a GPU.
    chunk = chunk or max(16, min(triton.next_power_of_2(num_pairs), 16384 // block_e))
    num_chunks = triton.cdiv(num_pairs, chunk)
    expert_map_arg = expert_map if expert_map is not None else ids
    counts = ids
    if num_chunks > 1:
        counts = torch.empty(num_chunks, block_e, dtype=torch.int32, device=device)
        _moe_align_count_kernel[(num_chunks,)](ids, expert_map_arg, counts, num_pairs, num_experts,
                                               HAS_MAP=expert_map is not None, CHUNK=chunk, BLOCK_E=block_e,
                                               num_warps=4, **dependent_launch(device, pdl))
    _moe_align_kernel[(num_chunks,)](
        ids, expert_map_arg, counts, sorted_ids, block_experts, num_padded,
        num_pairs, num_experts, num_chunks, block_experts.shape[0],
        HAS_MAP=expert_map is not None, ONE_CHUNK=num_chunks == 1, CHUNK=chunk, BLOCK_E=block_e, BLOCK_M=block_m,
        TABLE_ROWS=max(1, min(triton.next_power_of_2(num_chunks), 8192 // block_e)),
        LABEL_BLOCKS=max(1, min(16, 2048 // block_m)), num_warps=8 if chunk * block_e >= 8192 else 4,
        **dependent_launch(device, pdl),
    )
    return ExpertBlocks(sorted_ids, block_experts, num_padded, block_m)


def local_expert_ids_ref(topk_ids: torch.Tensor, expert_map: torch.Tensor | None) -> torch.Tensor:
    """Each pair's local expert (int64 [T * k]), -1 where it lives on another rank."""
    ids = topk_ids.reshape(-1).long()
    return ids if expert_map is None else expert_map.long()[ids]


def moe_align_block_size_ref(topk_ids: torch.Tensor, num_experts: int, block_m: int,
                             expert_map: torch.Tensor | None = None) -> ExpertBlocks:
    """Plain torch on the device (a stable sort by expert and a count), the kernel's layout exactly; rows past
    num_padded hold the sentinel and block_experts -1 past the last block in use."""
    _check(topk_ids, num_experts, block_m, expert_map)
    experts = local_expert_ids_ref(topk_ids, expert_map)
    num_pairs = experts.numel()
    device = experts.device
    rows = max_padded_rows(num_pairs, num_experts, block_m)
    routed = experts >= 0
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, torch.where(routed, experts, num_experts), torch.ones_like(experts))
    counts = counts[:num_experts]
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    starts = ends - padded
    order = torch.sort(torch.where(routed, experts, num_experts), stable=True).indices[:int(routed.sum())]
    sorted_experts = experts[order]
    rank = torch.arange(order.numel(), device=device) - (counts.cumsum(0) - counts)[sorted_experts]
    sorted_ids = torch.full((rows,), num_pairs, dtype=torch.int32, device=device)
    sorted_ids[starts[sorted_experts] + rank] = order.to(torch.int32)
    first_rows = torch.arange(rows // block_m, device=device) * block_m
    block_experts = torch.searchsorted(ends, first_rows, right=True)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1).to(torch.int32)
    num_padded = padded.sum().reshape(1).to(torch.int32)
    return ExpertBlocks(sorted_ids, block_experts, num_padded, block_m)
