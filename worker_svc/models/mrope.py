"""Multimodal rotary positions (M-RoPE, Qwen2.5-VL): every token has a temporal, a height and a width position, and
mrope_section divides each head's rotary frequencies among the three. A text token's three positions are equal, so it
rotates as plain rope does at that position; an image's placeholder tokens take its grid's coordinates. The
positions of a prompt come from its placeholders and its images' grids (mrope_positions); a token after the prompt
sits at its index plus the prompt's delta, so decoding is plain rope at shifted positions."""
import torch

from sluice.worker.models.rope import sectioned_cos_sin

_ROWS = 3  # a token's temporal, height and width positions


def mrope_positions(input_ids: list[int] | torch.Tensor, image_grid_thw: torch.Tensor, image_token_id: int,
                    spatial_merge_size: int) -> tuple[torch.Tensor, int]:
    """(int64 positions [3, len(input_ids)], delta), as transformers' Qwen2.5-VL get_rope_index computes them. Image i
    is the i-th run of image_token_id among input_ids, of t * h * w / spatial_merge_size ** 2 placeholders for its
    grid (t, h, w) in patches (image_grid_thw [num_images, 3]): image_positions of those runs."""
    ids = torch.as_tensor(input_ids).cpu()
    placeholders = torch.nonzero(ids == image_token_id).flatten().tolist()
    starts, used = [], 0
    for t, h, w in image_grid_thw.tolist():
        length = t * (h // spatial_merge_size) * (w // spatial_merge_size)
        starts.append(_placeholder_run(placeholders, used, length))
        used += length
    if used != len(placeholders):
        raise ValueError(f"{len(placeholders)} image placeholder tokens, but the images' grids hold {used}")
    return image_positions(len(ids), starts, image_grid_thw.tolist(), spatial_merge_size)


def image_positions(num_tokens: int, starts: list[int], grids: list[tuple[int, int, int]],
                    spatial_merge_size: int) -> tuple[torch.Tensor, int]:
    """(int64 positions [3, num_tokens], delta) of a prompt whose image i's placeholders start at index starts[i], one
    per cell of its merged grid: they sit at (start + frame, start + row, start + column) of it, and the text after
    it starts max(rows, columns) past start. A token at index i >= num_tokens sits at i + delta in all three."""
    pieces, position, index = [], 0, 0
    for start, (t, h, w) in zip(starts, grids):
        rows, columns = h // spatial_merge_size, w // spatial_merge_size
        pieces.append(_text_positions(start - index, position))
        position += start - index
        pieces.append(_grid_positions(t, rows, columns) + position)
        position += max(rows, columns)
        index = start + t * rows * columns
    pieces.append(_text_positions(num_tokens - index, position))
    positions = torch.cat(pieces, dim=1)
    return positions, int(positions.max()) + 1 - num_tokens if num_tokens else 0


def _placeholder_run(placeholders: list[int], first: int, length: int) -> int:
    """The index of the first of `length` consecutive placeholders, the `first`-th placeholder on."""
    run = placeholders[first:first + length]
    if len(run) < length or run[-1] - run[0] != length - 1:
        raise ValueError(f"image placeholders {first} to {first + length - 1} are not one run of {length} tokens: "
                         "each image needs as many consecutive placeholders as its merged grid has cells")
    return run[0]


def _text_positions(length: int, first: int) -> torch.Tensor:
    return torch.arange(first, first + length).expand(_ROWS, -1)


def _grid_positions(frames: int, rows: int, columns: int) -> torch.Tensor:
    """[3, frames * rows * columns]: each cell's (frame, row, column), row-major."""
    grid = torch.meshgrid(torch.arange(frames), torch.arange(rows), torch.arange(columns), indexing="ij")
    return torch.stack(grid).flatten(1)


def mrope_cos_sin(cos_sin_cache: torch.Tensor, positions: torch.Tensor, mrope_section: tuple[int, ...]) -> torch.Tensor:
    """[num_tokens, rotary_dim] cos/sin rows of tokens at positions [3, num_tokens] (on cos_sin_cache's device): the
    first mrope_section[0] frequencies at the temporal position, the next mrope_section[1] at the height one, the
    rest at the width one. The operators take them as a table with positions 0..num_tokens - 1."""
    device = cos_sin_cache.device
    sections = torch.repeat_interleave(torch.arange(len(mrope_section), device=device),
                                       torch.tensor(mrope_section, device=device))
    return sectioned_cos_sin(cos_sin_cache, positions, sections, torch.arange(len(sections), device=device))
