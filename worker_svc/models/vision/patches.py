"""Where a vision tower's blocks read each patch of a batch of images (PatchLayout), from the images' grids.

An image processor lays out each image's patches merge unit by merge unit (a square of spatial_merge_size patches a
side, the patches the merger joins into one token), units row-major over the image, images in order. The window
attention blocks attend within square windows of window_units units a side, tiling each frame from its top left; so
the tower reorders the units window by window (window_order), and the merger's tokens back at its end.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True, frozen=True)
class PatchLayout:
    """The patches of a batch of images in window order: each window's units together, windows and images in order."""

    window_order: torch.Tensor  # [num_units] int64: the units in window order, by their index in the processor's
    window_bounds: torch.Tensor  # [num_windows + 1] int32: each window's first patch in window order, then the total
    frame_bounds: torch.Tensor  # [num_frames + 1] int32: each image frame's first patch, then the total
    positions: torch.Tensor  # [2, num_patches] int64: each patch's row and column in its image, in window order

    def to(self, device: torch.device) -> "PatchLayout":
        """The layout with its order and positions on the device; the bounds, which attention splits by, stay."""
        return PatchLayout(self.window_order.to(device), self.window_bounds, self.frame_bounds,
                           self.positions.to(device))


def patch_layout(image_grid_thw: torch.Tensor, spatial_merge_size: int, window_units: int) -> PatchLayout:
    """image_grid_thw [num_images, 3]: each image's frames, rows and columns of patches."""
    unit = spatial_merge_size**2
    orders, window_sizes, positions, first_unit = [], [], [], 0
    for t, h, w in image_grid_thw.tolist():
        units = torch.arange(t * (h // spatial_merge_size) * (w // spatial_merge_size)).view(
            t, h // spatial_merge_size, w // spatial_merge_size) + first_unit
        for window in _windows(units, window_units):
            orders.append(window)
            window_sizes.append(len(window) * unit)
        positions.append(_patch_positions(h, w, spatial_merge_size).repeat(1, t))
        first_unit += units.numel()
    window_order = torch.cat(orders)
    in_window_order = torch.cat(positions, dim=1).view(2, -1, unit)[:, window_order].flatten(1)
    frame_sizes = torch.repeat_interleave(image_grid_thw[:, 1] * image_grid_thw[:, 2], image_grid_thw[:, 0])
    return PatchLayout(window_order, _bounds(torch.tensor(window_sizes)), _bounds(frame_sizes), in_window_order)


def _windows(units: torch.Tensor, side: int) -> list[torch.Tensor]:
    """The units [frames, rows, columns] of each window, row-major inside it: windows of side x side units tile
    each frame row-major (those at the bottom and right edges smaller)."""
    return [window.flatten() for frame in units for band in frame.split(side, dim=0)
            for window in band.split(side, dim=1)]


def _patch_positions(h: int, w: int, spatial_merge_size: int) -> torch.Tensor:
    """[2, h * w]: the row and column of each patch of one frame, in the processor's order (unit by unit)."""
    rows, columns = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    merged = (h // spatial_merge_size, spatial_merge_size, w // spatial_merge_size, spatial_merge_size)
    return torch.stack([grid.reshape(merged).transpose(1, 2).flatten() for grid in (rows, columns)])


def _bounds(sizes: torch.Tensor) -> torch.Tensor:
    return F.pad(sizes.cumsum(0), (1, 0)).to(torch.int32)
