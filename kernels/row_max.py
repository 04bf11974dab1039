"""Each row's largest value and the first index that holds it, as torch.max(dim=-1) gives them (row_max_ref), in two
launches that spread a row over the whole device: one program per chunk of a row finds the chunk's largest and its
first index, then one program per row picks the first chunk that holds the row's largest. torch's reduction gives
a row to one block of threads, so a batch-1 greedy step's argmax over a large vocabulary ran on one SM."""
import torch
import triton
import triton.language as tl

_CHUNK = 1024  # values a program of the first launch reads


@triton.jit
def _chunk_max_kernel(x_ptr, chunk_values_ptr, chunk_indices_ptr, n, row_stride, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    columns = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * row_stride + columns, mask=columns < n, other=float("-inf")).to(tl.float32)
    value, index = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
    out = row * tl.num_programs(1) + chunk
    tl.store(chunk_values_ptr + out, value)
    tl.store(chunk_indices_ptr + out, chunk * CHUNK + index)


@triton.jit
def _pick_chunk_kernel(chunk_values_ptr, chunk_indices_ptr, values_ptr, indices_ptr, num_chunks,
                       CHUNKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, CHUNKS)
    values = tl.load(chunk_values_ptr + row * num_chunks + offsets, mask=offsets < num_chunks, other=float("-inf"))
    value, chunk = tl.max(values, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(values_ptr + row, value.to(values_ptr.dtype.element_ty))
    tl.store(indices_ptr + row, tl.load(chunk_indices_ptr + row * num_chunks + chunk))


def row_max(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [rows, n] of finite or -inf values, each row contiguous -> (largest [rows] in x's dtype, its first index
    [rows] int64)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [rows, n] with contiguous rows, got {tuple(x.shape)} strides {x.stride()}")
    rows, n = x.shape
    num_chunks = triton.cdiv(n, _CHUNK)
    chunk_values = torch.empty(rows, num_chunks, dtype=torch.float32, device=x.device)
    chunk_indices = torch.empty(rows, num_chunks, dtype=torch.int64, device=x.device)
    values = torch.empty(rows, dtype=x.dtype, device=x.device)
    indices = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows:
        _chunk_max_kernel[(rows, num_chunks)](x, chunk_values, chunk_indices, n, x.stride(0), CHUNK=_CHUNK)
        _pick_chunk_kernel[(rows,)](chunk_values, chunk_indices, values, indices, num_chunks,
                                    CHUNKS=triton.next_power_of_2(num_chunks))
    return values, indices


def row_max_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(x.max(dim=-1))
