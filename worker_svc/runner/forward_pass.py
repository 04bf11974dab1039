"""A model's forward pass over a step's inputs, through its CUDA graphs where the step fits them: a step of one token
per sequence replays decode_graphs, another one of at most the largest bucket's tokens replays piecewise_graphs
around eager attention, and any other runs eagerly, as does a step that reaches a prompt's images. The target model
and a draft model each have one. With calculate_kv_scales, the first step runs eagerly and sets the FP8 KV cache's
scales (kv_scale_calibration.py)."""
import torch

from sluice.worker.ops.attention_metadata import AttentionMetadata
from sluice.worker.runner.decode_graphs import DecodeGraphs
from sluice.worker.runner.image_inputs import ImageStepInputs
from sluice.worker.runner.kv_scale_calibration import with_calculated_kv_scales
from sluice.worker.runner.piecewise_graphs import PiecewiseGraphs


class ForwardPass:
    def __init__(self, model, kv_caches, cos_sin_cache: torch.Tensor, decode_graphs: DecodeGraphs | None,
                 piecewise_graphs: PiecewiseGraphs | None, calculate_kv_scales: bool = False):
        self.model = model
        self.kv_caches = kv_caches
        self.cos_sin_cache = cos_sin_cache
        self.decode_graphs = decode_graphs
        self.piecewise_graphs = piecewise_graphs
        self.kv_scales_pending = calculate_kv_scales  # the first step prefills: it never replays decode_graphs

    def fits_decode_graph(self, meta: AttentionMetadata) -> bool:
        return self.decode_graphs is not None and meta.is_pure_decode and self.decode_graphs.fits(meta.num_seqs)

    def logits(self, token_inputs: torch.Tensor, meta: AttentionMetadata, logits_indices: torch.Tensor | None,
               images: ImageStepInputs | None = None, position_deltas: torch.Tensor | None = None) -> torch.Tensor:
        """The logits at the tokens logits_indices names (None: at every token). token_inputs: [3, num_tokens] int64
        input ids, positions and KV slots, which meta describes; images: a vision-language model's, where the step
        reaches a prompt's images; position_deltas: [num_tokens] int64, what each token's rope position adds to its
        index (None: nothing)."""
        if images is None and self.fits_decode_graph(meta):
            logits = self.decode_graphs.run(token_inputs[:2], meta.block_tables, meta.max_seq_len, meta.row_groups,
                                            position_deltas)
            return logits if logits_indices is None else logits[logits_indices]
        return self.model.logits(*self._hidden_states(token_inputs, meta, logits_indices, images, position_deltas))

    def replay_decode(self, max_seq_len: int) -> torch.Tensor:
        """The logits of the decode graphs' live rows' next step, from what their buffers hold (a step that continues
        the one before, decode_continuation)."""
        return self.decode_graphs.replay(max_seq_len)

    def hidden_states(self, token_inputs: torch.Tensor, meta: AttentionMetadata, indices: torch.Tensor | None,
                      images: ImageStepInputs | None = None,
                      position_deltas: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The last layer's output and residual at the tokens `indices` names (None: at every token)."""
        return self._hidden_states(token_inputs, meta, indices, images, position_deltas)

    def _hidden_states(self, token_inputs: torch.Tensor, meta: AttentionMetadata, indices: torch.Tensor | None,
                       images: ImageStepInputs | None,
                       position_deltas: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if position_deltas is not None:  # the KV slots are the tokens' own: only the rope positions move
            token_inputs = torch.stack((token_inputs[0], token_inputs[1] + position_deltas, token_inputs[2]))
        if self.kv_scales_pending:
            self.kv_scales_pending = False
            return with_calculated_kv_scales(self.model, lambda: self._eager(token_inputs, meta, indices, images))
        graphs = self.piecewise_graphs
        if images is not None or graphs is None or not graphs.fits(token_inputs.shape[1]):
            return self._eager(token_inputs, meta, indices, images)
        x, residual = graphs.run(token_inputs, meta)
        return (x, residual) if indices is None else (x[indices], residual[indices])

    def _eager(self, token_inputs: torch.Tensor, meta: AttentionMetadata, indices: torch.Tensor | None,
               images: ImageStepInputs | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if images is not None:
            return self.model.multimodal_hidden_states(token_inputs[0], images.mrope_positions, images.embeddings,
                                                       images.rows, self.cos_sin_cache, self.kv_caches, meta, indices)
        return self.model.hidden_states(token_inputs[0], token_inputs[1], self.cos_sin_cache, self.kv_caches, meta,
                                        indices)
