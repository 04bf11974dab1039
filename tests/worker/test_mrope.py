"""Multimodal rotary positions against transformers' Qwen2.5-VL: a prompt's 3-row positions and decode delta
(get_rope_index), and the cos/sin rows they rotate by."""
import pytest
import torch

from sluice.worker.models.mrope import mrope_cos_sin, mrope_positions
from sluice.worker.models.rope import build_cos_sin_cache
from tests.worker.tiny_qwen2_5_vl import GRIDS, IMAGE_TOKEN, hf_model, prompt

TEXT = [5, 17, 99, 3, 42, 7]


@pytest.mark.parametrize("grids", [[], GRIDS[:1], GRIDS[:2], GRIDS])
def test_positions_match_get_rope_index(grids):
    ids = prompt(grids, TEXT)
    hf = hf_model()
    input_ids = torch.tensor([ids])
    expected, expected_delta = hf.model.get_rope_index(
        input_ids, mm_token_type_ids=(input_ids == IMAGE_TOKEN).int(),
        image_grid_thw=torch.tensor(grids) if grids else None)
    positions, delta = mrope_positions(ids, torch.tensor(grids).view(-1, 3), IMAGE_TOKEN, spatial_merge_size=2)
    assert torch.equal(positions, expected[:, 0]) and delta == expected_delta.item()
    assert delta < 0 if grids else delta == 0  # an image takes fewer positions than placeholders


def test_an_image_ending_the_prompt_and_a_placeholder_count_that_misses():
    ids = [5, 6, IMAGE_TOKEN, IMAGE_TOKEN, IMAGE_TOKEN, IMAGE_TOKEN]
    positions, delta = mrope_positions(ids, torch.tensor([(1, 4, 4)]), IMAGE_TOKEN, spatial_merge_size=2)
    assert positions.tolist() == [[0, 1, 2, 2, 2, 2], [0, 1, 2, 2, 3, 3], [0, 1, 2, 3, 2, 3]] and delta == -2
    with pytest.raises(ValueError, match="not one run of 4 tokens"):
        mrope_positions(ids[:-1], torch.tensor([(1, 4, 4)]), IMAGE_TOKEN, spatial_merge_size=2)
    with pytest.raises(ValueError, match="6 image placeholder tokens, but the images' grids hold 4"):
        mrope_positions(ids + [IMAGE_TOKEN] * 2, torch.tensor([(1, 4, 4)]), IMAGE_TOKEN, spatial_merge_size=2)


def test_cos_sin_rows_match_transformers_rotary_embedding():
    hf = hf_model()
    ids = prompt(GRIDS[:2], TEXT)
    positions, _ = mrope_positions(ids, torch.tensor(GRIDS[:2]), IMAGE_TOKEN, spatial_merge_size=2)
    table = build_cos_sin_cache(16, len(ids), 10000.0, None, torch.float32)
    rows = mrope_cos_sin(table, positions, (2, 3, 3))
    cos, sin = hf.model.language_model.rotary_emb(torch.zeros(1, dtype=torch.float32), positions[:, None])
    torch.testing.assert_close(rows, torch.cat([cos[0, :, :8], sin[0, :, :8]], dim=-1), rtol=0, atol=1e-6)
    text = torch.arange(len(ids)).expand(3, -1)  # three equal positions: plain rope's rows
    assert torch.equal(mrope_cos_sin(table, text, (2, 3, 3)), table)
