"""A vision-language model's image inputs (vLLM's _execute_mm_encoder and _gather_mm_embeddings): the images'
encoder outputs, which the worker holds by image hash from the step the scheduler has one encoded to the step it has
one dropped; each image request's M-RoPE positions; and, for a step, the rows of its tokens that take image
embeddings. A chunk may hold part of an image's placeholders: it takes those rows of the image's output.

A step in which a request's chunk reaches its prompt's images runs eagerly at M-RoPE positions (the prompt's from
its images' grids); any other step, decodes among them, runs as a text model's, each token at its index plus its
request's delta (StepInputs.position_deltas)."""
from dataclasses import dataclass

import torch

from sluice.core.images import ImageInput
from sluice.core.step_plan import StepPlan
from sluice.worker.models.mrope import image_positions
from sluice.worker.runner.batch_state import BatchState, RequestState
from sluice.worker.runner.device_timer import TimedSpan, timed_span


@dataclass(slots=True)
class ImageStepInputs:
    mrope_positions: torch.Tensor  # [3, num_tokens] int64: each token's temporal, height and width positions
    embeddings: torch.Tensor  # [num_rows, hidden]: image embeddings of the step's placeholder tokens
    rows: torch.Tensor  # [num_rows] int64: the step's tokens they replace


class ImageInputs:
    def __init__(self, model, device: torch.device):
        self.model = model
        self.device = device
        self.encoder_outputs: dict[bytes, torch.Tensor] = {}  # image hash -> [placeholders, hidden]

    def apply(self, plan: StepPlan, batch: BatchState) -> TimedSpan | None:
        """The plan's changes to the encoder cache, and the M-RoPE positions of its new requests with images. Returns
        the device time of its encoder pass, where it has one."""
        span = None
        for image_hash in plan.freed_encoder_hashes:
            del self.encoder_outputs[image_hash]
        if plan.encoder_inputs:
            with timed_span(self.device) as span:
                self._encode(plan.encoder_inputs)
        for new in plan.new_requests:
            if new.images:
                state = batch.requests[new.request_id]
                state.images = new.images
                state.mrope_positions, state.position_delta = image_positions(
                    state.num_prompt_tokens, [image.offset for image in new.images],
                    [image.grid_thw for image in new.images], self.model.config.vision.spatial_merge_size)
        return span

    def step_inputs(self, states: list[RequestState], query_lens: list[int]) -> ImageStepInputs | None:
        """The step's image inputs; None when no request's chunk reaches its last image's placeholders."""
        starts = [state.num_computed_tokens for state in states]
        if not any(state.images and start < state.images[-1].end for state, start in zip(states, starts)):
            return None
        columns, rows, embeddings = [], [], []
        offset = 0
        for state, start, length in zip(states, starts, query_lens):
            end, shifted_from = start + length, start
            if state.images and start < state.images[-1].end:
                shifted_from = min(end, state.num_prompt_tokens)
                columns.append(state.mrope_positions[:, start:shifted_from])
                for image in state.images:
                    first, last = max(start, image.offset), min(end, image.end)
                    if first < last:
                        rows.append(torch.arange(offset + first - start, offset + last - start))
                        embeddings.append(self.encoder_outputs[image.hash][first - image.offset:last - image.offset])
            columns.append((torch.arange(shifted_from, end) + state.position_delta).expand(3, -1))
            offset += length
        hidden = self.model.config.hidden_size
        return ImageStepInputs(
            torch.cat(columns, dim=1).to(self.device),
            torch.cat(embeddings) if embeddings else torch.zeros(0, hidden, device=self.device),
            torch.cat(rows).to(self.device) if rows else torch.zeros(0, dtype=torch.int64, device=self.device))

    def _encode(self, images: list[ImageInput]) -> None:
        """One pass of the vision tower over the images."""
        pixel_values = torch.cat([torch.frombuffer(bytearray(image.pixel_values), dtype=torch.float32)
                                  .view(image.pixel_shape) for image in images]).to(self.device)
        grid_thw = torch.tensor([image.grid_thw for image in images])
        outputs = self.model.image_embeddings(pixel_values, grid_thw).split([image.length for image in images])
        self.encoder_outputs.update(zip((image.hash for image in images), outputs))
