"""VisionConfig: the shape of a Qwen2.5-VL vision tower, read from a Hugging Face config.json's vision_config."""
from dataclasses import dataclass

from sluice.core.images import VisionInfo


@dataclass(slots=True, frozen=True)
class VisionConfig:
    """The shape of a vision tower, and the placeholder token whose embeddings its outputs replace."""

    depth: int  # blocks
    hidden_size: int
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int  # pixels a square patch's side
    temporal_patch_size: int  # frames a patch spans (an image's one frame, repeated)
    spatial_merge_size: int  # patches a merged token's side (the merger concatenates its square of patches)
    window_size: int  # pixels a square attention window's side
    full_attention_blocks: tuple[int, ...]  # the blocks that attend across a whole image, not within windows
    out_hidden_size: int  # the language model's hidden size
    rope_theta: float
    image_token_id: int

    @classmethod
    def from_hf(cls, vision: dict, image_token_id: int) -> "VisionConfig":
        """vision: the config's vision_config, with transformers' defaults of the fields it lacks."""
        return cls(
            depth=vision["depth"],
            hidden_size=vision["hidden_size"],
            intermediate_size=vision["intermediate_size"],
            num_heads=vision["num_heads"],
            in_channels=vision["in_channels"],
            patch_size=vision["patch_size"],
            temporal_patch_size=vision["temporal_patch_size"],
            spatial_merge_size=vision["spatial_merge_size"],
            window_size=vision["window_size"],
            full_attention_blocks=tuple(vision["fullatt_block_indexes"]),
            out_hidden_size=vision["out_hidden_size"],
            rope_theta=(vision.get("rope_parameters") or {}).get("rope_theta", 10000.0),
            image_token_id=image_token_id,
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """The values of one patch in pixel_values: channels x frames x pixels x pixels."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def info(self) -> VisionInfo:
        """What the model expects of the images a scheduler sends it."""
        return VisionInfo(self.image_token_id, self.spatial_merge_size, self.patch_dim)

    @property
    def merge_unit(self) -> int:
        """Patches per merged token."""
        return self.spatial_merge_size**2

    @property
    def window_units(self) -> int:
        """Merged tokens a window's side."""
        return self.window_size // self.spatial_merge_size // self.patch_size
