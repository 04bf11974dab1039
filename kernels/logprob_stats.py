"""What a row's logprobs need from its logits, read once: per chunk of the vocabulary its largest logit, the sum of
exp(logit - that), how many logits exceed the row's chosen one, and its num_top largest logits with their token ids.
A second kernel, one program per row, reduces the chunks to the row's normaliser, the chosen token's rank and the
row's top tokens over a few hundred candidates, where torch.logsumexp, a comparison over the row and torch.topk each
read the whole row (the top-k in several passes). Reference: sluice.worker.sampling.token_logprobs, which the CPU
runs."""
import torch
import triton
import triton.language as tl

_CHUNK = 4096  # vocabulary entries per program
# NOTE: H200, 256 rows of 151,936, num_top 5, the chunk kernel alone: 186 us in chunks of 2,048 with 8 warps, 114 with
# 4 warps; 104 in chunks of 4,096 and 103 of 8,192 with 4 warps (the rows' reduction in torch then took 85 us more).
_GROUP = tl.constexpr(32)  # columns whose largest logit picks whether the top-token search reads them


@triton.jit
def _chunk_stats_kernel(logits_ptr, token_ids_ptr, max_ptr, sum_ptr, above_ptr, top_values_ptr, top_ids_ptr, vocab,
                        row_stride, NUM_TOP: tl.constexpr, TOP_BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    out = row * tl.num_programs(1) + chunk
    offsets = tl.arange(0, CHUNK)
    columns = chunk * CHUNK + offsets
    logits_ptr += row * row_stride
    x = tl.load(logits_ptr + columns, mask=columns < vocab, other=float("-inf")).to(tl.float32)
    chosen = tl.load(logits_ptr + tl.load(token_ids_ptr + row)).to(tl.float32)
    largest = tl.max(x, axis=0)
    tl.store(max_ptr + out, largest)
    tl.store(sum_ptr + out, tl.sum(tl.exp(x - largest), axis=0))
    tl.store(above_ptr + out, tl.sum((x > chosen).to(tl.int32), axis=0))
    if NUM_TOP > 0:
        _chunk_top(x, logits_ptr, chunk * CHUNK, vocab, top_values_ptr + out * NUM_TOP, top_ids_ptr + out * NUM_TOP,
                   NUM_TOP, TOP_BLOCK, CHUNK, _GROUP)


@triton.jit
def _chunk_top(x, logits_ptr, start, vocab, values_out_ptr, ids_out_ptr, NUM_TOP: tl.constexpr,
               TOP_BLOCK: tl.constexpr, CHUNK: tl.constexpr, GROUP: tl.constexpr):
    """The chunk's NUM_TOP largest logits, largest first and the lowest id first among ties. They lie in the NUM_TOP
    groups of GROUP columns with the largest maxima (ties: the lower group), so the selection reads those alone."""
    group_max = tl.max(tl.reshape(x, (CHUNK // GROUP, GROUP)), axis=1)
    groups = tl.arange(0, CHUNK // GROUP)
    slots = tl.arange(0, TOP_BLOCK)
    starts = tl.zeros([TOP_BLOCK], dtype=tl.int32)
    for t in tl.static_range(NUM_TOP):
        _, group = tl.max(group_max, axis=0, return_indices=True, return_indices_tie_break_left=True)
        starts = tl.where(slots == t, group * GROUP, starts)
        group_max = tl.where(groups == group, float("-inf"), group_max)
    columns = start + starts[:, None] + tl.arange(0, GROUP)[None, :]
    kept = (slots < NUM_TOP)[:, None] & (columns < vocab)
    values = tl.reshape(tl.load(logits_ptr + columns, mask=kept, other=float("-inf")).to(tl.float32),
                        (TOP_BLOCK * GROUP,))
    columns = tl.reshape(columns, (TOP_BLOCK * GROUP,))
    for t in tl.static_range(NUM_TOP):  # the largest left, first among ties the lowest id, then drop it
        value = tl.max(values, axis=0)
        column = tl.min(tl.where(values == value, columns, start + CHUNK), axis=0)
        tl.store(values_out_ptr + t, value)
        tl.store(ids_out_ptr + t, column.to(tl.int64))
        values = tl.where(columns == column, float("-inf"), values)


@triton.jit
def _row_stats_kernel(max_ptr, sum_ptr, above_ptr, top_values_ptr, top_ids_ptr, normaliser_ptr, rank_ptr,
                      values_out_ptr, ids_out_ptr, num_chunks, vocab, NUM_TOP: tl.constexpr,
                      TOP_BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunks = tl.arange(0, CHUNKS)
    inside = chunks < num_chunks
    at = row * num_chunks + chunks
    maxes = tl.load(max_ptr + at, mask=inside, other=float("-inf"))
    largest = tl.max(maxes, axis=0)
    sums = tl.load(sum_ptr + at, mask=inside, other=0.0)
    normaliser = largest + tl.log(tl.sum(sums * tl.exp(maxes - largest), axis=0))
    tl.store(normaliser_ptr + row, normaliser)
    tl.store(rank_ptr + row, tl.sum(tl.load(above_ptr + at, mask=inside, other=0), axis=0).to(tl.int64) + 1)
    if NUM_TOP > 0:
        candidates = (row * num_chunks + chunks[:, None]) * NUM_TOP + tl.arange(0, TOP_BLOCK)[None, :]
        kept = inside[:, None] & (tl.arange(0, TOP_BLOCK) < NUM_TOP)[None, :]
        values = tl.reshape(tl.load(top_values_ptr + candidates, mask=kept, other=float("-inf")),
                            (CHUNKS * TOP_BLOCK,))
        ids = tl.reshape(tl.load(top_ids_ptr + candidates, mask=kept, other=vocab), (CHUNKS * TOP_BLOCK,))
        for t in tl.static_range(NUM_TOP):  # the largest left, first among ties the lowest id, then drop it
            value = tl.max(values, axis=0)
            token = tl.min(tl.where(values == value, ids, vocab), axis=0)
            tl.store(values_out_ptr + row * NUM_TOP + t, value)
            tl.store(ids_out_ptr + row * NUM_TOP + t, token)
            values = tl.where(ids == token, float("-inf"), values)


def logprob_stats(logits: torch.Tensor, token_ids: torch.Tensor,
                  num_top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits: [rows, vocab] float32, rows contiguous; token_ids: [rows] int64, each row's chosen token. -> each row's
    log-normaliser (logsumexp) [rows], the chosen token's rank (1 + how many logits exceed its) [rows] int64, and its
    num_top largest logits [rows, num_top] float32 with their token ids [rows, num_top] int64, largest first and the
    lowest id first among ties."""
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("logits rows must be contiguous")
    if vocab < num_top:
        raise ValueError(f"num_top {num_top} exceeds the vocabulary ({vocab})")
    num_chunks = triton.cdiv(vocab, _CHUNK)
    device = logits.device
    maxes = torch.empty(rows, num_chunks, device=device)
    sums = torch.empty(rows, num_chunks, device=device)
    above = torch.empty(rows, num_chunks, dtype=torch.int32, device=device)
    chunk_values = torch.empty(rows, num_chunks * num_top, device=device)
    chunk_ids = torch.empty(rows, num_chunks * num_top, dtype=torch.int64, device=device)
    normaliser = torch.empty(rows, device=device)
    ranks = torch.empty(rows, dtype=torch.int64, device=device)
    top_values = torch.empty(rows, num_top, device=device)
    top_ids = torch.empty(rows, num_top, dtype=torch.int64, device=device)
    if rows:
        top_block = triton.next_power_of_2(max(num_top, 1))
        _chunk_stats_kernel[(rows, num_chunks)](logits, token_ids, maxes, sums, above, chunk_values, chunk_ids, vocab,
                                                logits.stride(0), NUM_TOP=num_top, TOP_BLOCK=top_block, CHUNK=_CHUNK,
                                                num_warps=4)
        _row_stats_kernel[(rows,)](maxes, sums, above, chunk_values, chunk_ids, normaliser, ranks, top_values, top_ids,
                                   num_chunks, vocab, NUM_TOP=num_top, TOP_BLOCK=top_block,
                                   CHUNKS=triton.next_power_of_2(num_chunks), num_warps=4)
    return normaliser, ranks, top_values, top_ids
