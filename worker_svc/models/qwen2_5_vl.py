"""Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration): Qwen2's decoder layers under multimodal rope (mrope.py), and a
vision tower (vision/) whose image embeddings replace the embeddings of the prompt's image placeholder tokens.

A step of text tokens alone (decoding, and text-only prompts) runs as any decoder's: its tokens' three positions are
equal, so their cos/sin rows are the plain table's at a position (index + the request's delta, 0 for text-only
prompts). A step that prefills image placeholders runs multimodal_hidden_states: the image embeddings go in at the
placeholders, and each token's rows are gathered from the table at its 3 positions, once per forward, into a table of
the step's own that the attention operators read at positions 0..num_tokens - 1. The tower is whole on every rank.
"""
import torch

from sluice.worker.models.config import ModelConfig
from sluice.worker.models.decoder import DecoderLM
from sluice.worker.models.mrope import mrope_cos_sin, mrope_positions
from sluice.worker.models.registry import ArchitectureTraits
from sluice.worker.models.tensor_parallel import TensorParallelDecoderLM
from sluice.worker.models.vision.tower import VisionTransformer
from sluice.worker.ops.attention_metadata import AttentionMetadata


class QwenVisionLanguageLM(DecoderLM):
    takes_images = True

    def __init__(self, config: ModelConfig, traits: ArchitectureTraits, ops):
        super().__init__(config, traits, ops)
        self.visual = VisionTransformer(config.vision, ops)

    def prompt_positions(self, prompt_token_ids: list[int] | torch.Tensor,
                         image_grid_thw: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(int64 positions [3, num_prompt_tokens], delta): the prompt's M-RoPE positions, its images' placeholders
        at their grids' cells, and the shift of the positions of the tokens after it (mrope.mrope_positions)."""
        vision = self.config.vision
        return mrope_positions(prompt_token_ids, image_grid_thw, vision.image_token_id, vision.spatial_merge_size)

    def image_embeddings(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        """[num_placeholders, hidden]: the embeddings of the images' placeholder tokens, image by image (t * h * w /
        spatial_merge_size ** 2 each), from an image processor's pixel_values [num_patches, patch_dim] and
        image_grid_thw [num_images, 3] (frames, rows and columns of patches)."""
        return self.visual(pixel_values, image_grid_thw)

    def multimodal_hidden_states(self, input_ids: torch.Tensor, mrope_positions: torch.Tensor,
                                 image_embeddings: torch.Tensor, image_rows: torch.Tensor, cos_sin_cache: torch.Tensor,
                                 kv_caches, meta: AttentionMetadata,
                                 logits_indices: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden_states of a step whose tokens sit at mrope_positions [3, num_tokens] (mrope.mrope_positions'
        columns of each request's tokens; a text token's three equal), the rows of image_embeddings [num_rows,
        hidden] in at the step's tokens image_rows [num_rows] names (image placeholders). cos_sin_cache: the plain
        table (cos_sin_cache())."""
        x = self.embed(input_ids).index_copy(0, image_rows, image_embeddings.to(self.embed_tokens.weight.dtype))
        cos_sin = mrope_cos_sin(cos_sin_cache, mrope_positions, self.config.mrope_section)
        rows = torch.arange(len(input_ids), device=input_ids.device)
        return self.hidden_states_from_embeddings(x, rows, cos_sin, kv_caches, meta, logits_indices)


class TensorParallelQwenVisionLanguageLM(TensorParallelDecoderLM, QwenVisionLanguageLM):
    """The rank's heads and columns of the language model, and the whole vision tower."""
