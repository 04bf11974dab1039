"""A decode step's attention inputs, computed on the device from where each row's next token sits."""
import torch
import triton
import triton.language as tl

from sluice.kernels.dependent_launch import dependent_launch, wait_for_inputs

BLOCK_ROWS = 256


@triton.jit
def _decode_step_inputs_kernel(
    next_positions_ptr, live_ptr, block_tables_ptr, positions_ptr, slot_mapping_ptr, seq_lens_ptr,
    num_rows, stride_table, BLOCK_SIZE: tl.constexpr, BLOCK_ROWS: tl.constexpr, PDL: tl.constexpr,
):
    """Each program handles BLOCK_ROWS rows. A live row's token sits at its next position: its KV slot is that
    position's offset in the block its table names there, and its context ends one past it; then the next position
    advances. A padding row gets position 0, slot -1 (nothing is written) and a context of one token."""
    wait_for_inputs(PDL)
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    in_range = rows < num_rows
    live = tl.load(live_ptr + rows, mask=in_range, other=0) != 0
    next_position = tl.load(next_positions_ptr + rows, mask=in_range, other=0)
    position = tl.where(live, next_position, 0)
    block = tl.load(block_tables_ptr + rows.to(tl.int64) * stride_table + position // BLOCK_SIZE,
                    mask=in_range & live, other=0)
    slot = tl.where(live, block.to(tl.int64) * BLOCK_SIZE + position % BLOCK_SIZE, -1)
    tl.store(positions_ptr + rows, position, mask=in_range)
    tl.store(slot_mapping_ptr + rows, slot, mask=in_range)
    tl.store(seq_lens_ptr + rows, (position + 1).to(tl.int32), mask=in_range)
    tl.store(next_positions_ptr + rows, next_position + live.to(tl.int64), mask=in_range)


def decode_step_inputs(next_positions: torch.Tensor, live: torch.Tensor, block_tables: torch.Tensor,
                       positions: torch.Tensor, slot_mapping: torch.Tensor, seq_lens: torch.Tensor,
                       block_size: int, pdl: bool = True) -> None:
    """In place: positions, slot_mapping and seq_lens of one token per row, from next_positions (int64 [rows]),
    live (bool [rows]) and block_tables (int32 [rows, max_blocks]); then next_positions advance by one on live
    rows. positions and slot_mapping: int64 [rows]; seq_lens: int32 [rows]."""
    (num_rows,) = next_positions.shape
    if block_tables.dim() != 2 or block_tables.shape[0] != num_rows or block_tables.stride(1) != 1:
        raise ValueError(f"block_tables {tuple(block_tables.shape)} must be [{num_rows}, max_blocks], contiguous in "
                         f"blocks")
    for name, t, dtype in (("next_positions", next_positions, torch.int64), ("live", live, torch.bool),
                           ("block_tables", block_tables, torch.int32), ("positions", positions, torch.int64),
                           ("slot_mapping", slot_mapping, torch.int64), ("seq_lens", seq_lens, torch.int32)):
        if t.dtype != dtype or t.shape[0] != num_rows or (t.dim() == 1 and t.stride(0) != 1):
            raise ValueError(f"{name} must be {dtype} with {num_rows} contiguous rows, got {t.dtype} "
                             f"{tuple(t.shape)}")
    if num_rows == 0:
        return
    _decode_step_inputs_kernel[(triton.cdiv(num_rows, BLOCK_ROWS),)](
        next_positions, live, block_tables, positions, slot_mapping, seq_lens, num_rows, block_tables.stride(0),
        BLOCK_SIZE=block_size, BLOCK_ROWS=BLOCK_ROWS, **dependent_launch(next_positions.device, pdl),
    )


def decode_step_inputs_ref(next_positions: torch.Tensor, live: torch.Tensor, block_tables: torch.Tensor,
                           positions: torch.Tensor, slot_mapping: torch.Tensor, seq_lens: torch.Tensor,
                           block_size: int) -> None:
    """Plain torch, in place, as decode_step_inputs."""
    positions.copy_(torch.where(live, next_positions, 0))
    blocks = block_tables.gather(1, (positions // block_size).unsqueeze(1)).squeeze(1).long()
    slot_mapping.copy_(torch.where(live, blocks * block_size + positions % block_size, -1))
    seq_lens.copy_(positions + 1)
    next_positions.add_(live)
