"""A pipeline stage's forward pass: ForwardPass's routes (decode graphs, piecewise graphs, eager) over the stage's
layers, with the transfers between the stages around them, never inside a captured graph. Before a pass or a graph's
replay, the previous stage's activations of the step's tokens are received into the static buffer that the stage's
passes read (PipelineStageLM.received); after it, a stage before the last sends its output, the activations of
every token, to the next stage, and returns no rows of it. On CUDA both transfers are queued on the stream in order
with the passes, so no host waits for the device between them."""
import torch

from sluice.worker.models.pipeline_stage import PipelineStageLM
from sluice.worker.ops.attention_metadata import AttentionMetadata
from sluice.worker.parallel.pipeline import PipelineStage
from sluice.worker.runner.forward_pass import ForwardPass
from sluice.worker.runner.image_inputs import ImageStepInputs


class StageForwardPass(ForwardPass):
    model: PipelineStageLM

    @property
    def stage(self) -> PipelineStage:
        return self.model.stage

    def logits(self, token_inputs: torch.Tensor, meta: AttentionMetadata, logits_indices: torch.Tensor | None,
               images: ImageStepInputs | None = None, position_deltas: torch.Tensor | None = None) -> torch.Tensor:
        """ForwardPass's logits on the last stage; an empty output on the others."""
        self._receive(token_inputs.shape[1])
        output = super().logits(token_inputs, meta, logits_indices if self.stage.is_last else None, images,
                                position_deltas)
        return self._handed_on(output)

    def replay_decode(self, max_seq_len: int) -> torch.Tensor:
        self._receive(self.decode_graphs.num_live)
        return self._handed_on(super().replay_decode(max_seq_len))

    def hidden_states(self, token_inputs: torch.Tensor, meta: AttentionMetadata, indices: torch.Tensor | None,
                      images: ImageStepInputs | None = None,
                      position_deltas: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """ForwardPass's hidden states on the last stage; no rows on the others."""
        self._receive(token_inputs.shape[1])
        if self.stage.is_last:
            return super().hidden_states(token_inputs, meta, indices, images, position_deltas)
        x, residual = super().hidden_states(token_inputs, meta, None, images, position_deltas)
        self._handed_on(self.model.logits(x, residual))
        return x[:0], residual[:0]

    def _receive(self, num_tokens: int) -> None:
        if not self.stage.is_first:
            self.stage.receive_activations(self.model.received[:num_tokens])

    def _handed_on(self, output: torch.Tensor) -> torch.Tensor:
        """The last stage's output; an earlier stage's, sent to the next stage, as no rows."""
        if self.stage.is_last:
            return output
        self.stage.send_activations(output)
        return output[:0]
