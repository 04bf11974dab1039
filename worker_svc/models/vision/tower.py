"""Qwen2.5-VL's vision tower (VisionTransformer): image embeddings for the language model's placeholder tokens, from
an image processor's patches. It runs once per image, in plain torch on the model's operators."""
import torch
import torch.nn.functional as F
from torch import nn

from sluice.worker.models.layers import RMSNorm
from sluice.worker.models.rope import build_cos_sin_cache, sectioned_cos_sin
from sluice.worker.models.vision.blocks import NORM_EPS, VisionBlock
from sluice.worker.models.vision.config import VisionConfig
from sluice.worker.models.vision.patches import patch_layout


class PatchEmbedding(nn.Module):
    """Each patch's channels x frames x pixels x pixels projected to the tower's width: transformers' Conv3d, whose
    stride is its kernel, as the one matrix product it is."""

    def __init__(self, config: VisionConfig):
        super().__init__()
        kernel = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(config.in_channels, config.hidden_size, kernel, stride=kernel, bias=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        weight = self.proj.weight.flatten(1)  # [hidden, channels * frames * pixels * pixels]
        return F.linear(pixel_values.to(weight.dtype), weight)


class PatchMerger(nn.Module):
    """Each merge unit's patches, normed and concatenated, through a GELU MLP to the language model's width."""

    def __init__(self, config: VisionConfig, ops):
        super().__init__()
        self.width = config.hidden_size * config.merge_unit
        self.ln_q = RMSNorm(config.hidden_size, NORM_EPS, ops)
        self.mlp = nn.Sequential(nn.Linear(self.width, self.width), nn.GELU(),
                                 nn.Linear(self.width, config.out_hidden_size))
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        units = self.ln_q(x, None)[0].view(-1, self.width)  # [num_units, merge_unit * hidden]
        return self.ops.linear(F.gelu(self.ops.linear(units, self.mlp[0])), self.mlp[2])


class VisionTransformer(nn.Module):
    """Blocks attend within windows (patches.py), but the full_attention_blocks, which attend across each image frame;
    every block rotates q and k by each patch's row (the first half of the frequencies) and column (the second)."""

    def __init__(self, config: VisionConfig, ops):
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbedding(config)
        self.blocks = nn.ModuleList(VisionBlock(config, ops) for _ in range(config.depth))
        self.merger = PatchMerger(config, ops)

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        """Image embeddings [num_units, out_hidden_size], the images' in order (each image's t * h * w /
        spatial_merge_size ** 2), from pixel_values [num_patches, patch_dim] as the image processor lays them out
        and image_grid_thw [num_images, 3], each image's frames, rows and columns of patches."""
        config, image_grid_thw = self.config, image_grid_thw.cpu()
        layout = patch_layout(image_grid_thw, config.spatial_merge_size, config.window_units).to(pixel_values.device)
        x = self.patch_embed(pixel_values)  # [num_patches, hidden]
        x = x.view(-1, config.merge_unit, x.shape[-1])[layout.window_order].flatten(0, 1)
        cos_sin = self._rotary_rows(layout.positions, int(image_grid_thw[:, 1:].max()))
        for index, block in enumerate(self.blocks):
            full = index in config.full_attention_blocks
            x = block(x, cos_sin, layout.frame_bounds if full else layout.window_bounds)
        return self.merger(x)[torch.argsort(layout.window_order)]

    def _rotary_rows(self, positions: torch.Tensor, num_positions: int) -> torch.Tensor:
        """[num_patches, head_dim] cos/sin rows of the patches at positions [2, num_patches] (rows and columns below
        num_positions): a rope of head_dim / 2 dims, its frequencies once at the patch's row and once at its column."""
        quarter, device = self.config.head_dim // 4, positions.device
        table = build_cos_sin_cache(2 * quarter, num_positions, self.config.rope_theta, None, torch.float32)
        sections = torch.arange(2, device=device).repeat_interleave(quarter)
        return sectioned_cos_sin(table.to(device), positions, sections, torch.arange(quarter, device=device).repeat(2))
