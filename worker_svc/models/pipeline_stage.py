"""A pipeline stage's part of a decoder: its layers, with the embedding on the first stage and the final norm and LM
head on the last. A stage after the first reads its input activations (the hidden states and the residual stream of
every token of the step) from a static buffer, `received`, that the previous stage's output is received into before
each pass (or graph replay) reads it; a stage before the last outputs its own, for the next stage, where the last
computes logits. No pass sends or receives anything itself, so a stage's passes are captured as CUDA graphs as a
whole model's are. The stage keeps the model's layer numbers, so its weights load under their checkpoint names."""
import torch
from torch import nn

from sluice.worker.models.decoder import DecoderLM
from sluice.worker.ops.attention_metadata import AttentionMetadata
from sluice.worker.parallel.pipeline import PipelineStage


class MissingLayer(nn.Module):
    """A layer that another stage runs: it holds no weights here."""

    def forward(self, *args):
        raise RuntimeError("this layer runs on another pipeline stage")


def cut_to_stage(model: DecoderLM, stage: PipelineStage) -> None:
    """In place (on the meta device, before the weights load): the layers of other stages become MissingLayer, the
    embedding stays on the first stage, the final norm and the LM head on the last."""
    for layer in range(len(model.layers)):
        if layer not in stage.layers:
            model.layers[layer] = MissingLayer()
    if not stage.is_first:
        model.embed_tokens = None
    if not stage.is_last:
        model.norm = model.lm_head = None


class PipelineStageLM:
    """DecoderLM's forward pass (hidden_states, logits) over one stage's layers of a model cut_to_stage cut. A stage
    before the last ignores logits_indices (the next stage needs every token) and its "logits" are the activations
    it hands on: [num_tokens, 2, hidden], each token's hidden states and residual stream."""

    takes_images = False

    def __init__(self, model: DecoderLM, stage: PipelineStage, dtype: torch.dtype):
        """dtype: the activations' (the model dtype)."""
        self.model = model
        self.stage = stage
        self.dtype = dtype
        self.config = model.config
        self.layers = [model.layers[layer] for layer in stage.layers]
        self.received: torch.Tensor | None = None  # [max_num_tokens, 2, hidden], after the first stage

    def hold_received(self, max_num_tokens: int, device: torch.device) -> None:
        """Allocates `received` (a stage after the first) for steps of up to max_num_tokens tokens."""
        if not self.stage.is_first:
            self.received = torch.zeros(max_num_tokens, 2, self.config.hidden_size, dtype=self.dtype, device=device)

    def __call__(self, input_ids, positions, cos_sin_cache, kv_caches, meta: AttentionMetadata,
                 logits_indices: torch.Tensor | None) -> torch.Tensor:
        return self.logits(*self.hidden_states(input_ids, positions, cos_sin_cache, kv_caches, meta, logits_indices))

    def hidden_states(self, input_ids, positions, cos_sin_cache, kv_caches, meta: AttentionMetadata,
                      logits_indices: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.stage.is_first:
            x, residual = self.model.embed(input_ids), None
        else:
            x, residual = (t.contiguous() for t in self.received[:input_ids.shape[0]].unbind(1))
        for layer, kv_cache in zip(self.layers, kv_caches):
            x, residual = layer(x, residual, positions, cos_sin_cache, kv_cache, meta)
        if self.stage.is_last and logits_indices is not None:
            x, residual = x[logits_indices], residual[logits_indices]
        return x, residual

    def logits(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if not self.stage.is_last:
            return torch.stack((x, residual), dim=1)
        return self.model.logits(x, residual)

    def cos_sin_cache(self, max_position: int) -> torch.Tensor:
        return self.model.cos_sin_cache(max_position)
