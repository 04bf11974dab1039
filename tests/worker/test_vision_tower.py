"""Qwen2.5-VL's vision tower against transformers' (the same weights): window and full attention blocks over
images whose windows are ragged or whole."""
import pytest
import torch

from sluice.worker.models.vision.config import VisionConfig
from sluice.worker.models.vision.patches import patch_layout
from sluice.worker.models.vision.tower import VisionTransformer
from sluice.worker.ops.plain_torch import TorchOps
from tests.worker.tiny_qwen2_5_vl import GRIDS, IMAGE_TOKEN, hf_model, images


@pytest.mark.parametrize("grids", [GRIDS[:1], GRIDS[1:2], GRIDS])
def test_tower_matches_transformers(grids):
    hf = hf_model()
    tower = VisionTransformer(VisionConfig.from_hf(hf.config.vision_config.to_dict(), IMAGE_TOKEN), TorchOps())
    tower.load_state_dict(hf.model.visual.state_dict(), strict=True)
    pixel_values, grid_thw = images(grids)
    with torch.inference_mode():
        expected = hf.model.visual(pixel_values, grid_thw=grid_thw).pooler_output
        got = tower(pixel_values, grid_thw)
    assert got.shape == (sum(t * h * w for t, h, w in grids) // 4, 64)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_windows_tile_each_frame_from_its_top_left():
    """A 6 x 10 grid of patches is 3 x 5 merged tokens: windows of 2 x 2 tokens, the last row and column ragged."""
    layout = patch_layout(torch.tensor([(1, 6, 10)]), spatial_merge_size=2, window_units=2)
    assert layout.window_order[:8].tolist() == [0, 1, 5, 6, 2, 3, 7, 8]
    assert (layout.window_bounds.diff() // 4).tolist() == [4, 4, 2, 2, 2, 1]
    assert layout.frame_bounds.tolist() == [0, 60]
    assert layout.positions[:, :8].tolist() == [[0, 0, 1, 1, 0, 0, 1, 1], [0, 1, 0, 1, 2, 3, 2, 3]]
