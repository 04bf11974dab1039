"""ModelRunner: a StepPlan launched as tensors through the model and the sampler, its outcome collected."""
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from itertools import accumulate

import torch

from sluice.core.logprobs import LogprobRows
from sluice.core.step_plan import StepOutcome, StepPlan
from sluice.worker.ops.attention_metadata import rows_per_program
from sluice.worker.runner.batch_state import BatchState, RequestState
from sluice.worker.runner.decode_continuation import DecodeContinuation
from sluice.worker.runner.device_timer import TimedSpan
from sluice.worker.runner.draft_proposer import DraftProposer
from sluice.worker.runner.forward_pass import ForwardPass
from sluice.worker.runner.image_inputs import ImageInputs
from sluice.worker.runner.kv_cache import copy_blocks
from sluice.worker.runner.logits_rows import LogitsRows, logits_rows
from sluice.worker.runner.step_inputs import SampledTokens, StepInputBuilder, StepInputs
from sluice.worker.sampling.speculative import Drafts
from sluice.worker.sampling.step import DeviceSample, StepSampler
from sluice.worker.sampling.token_logprobs import LogprobTensors, joined
from sluice.worker.sampling.upload import upload

PROMPT_LOGPROB_ROWS = 256  # prompt positions whose logits are held at once


@dataclass(slots=True)
class LaunchedStep:
    """A step whose work is queued on the device; its sampled tokens and logprobs are on their way to the host."""

    step_id: int
    sample: DeviceSample | None = None
    sampled: list[RequestState] = field(default_factory=list)  # the requests that sampled, in sample order
    # the sampled tokens, then, with proposals, each one's accepted count, then a draft model's proposals
    host_token_ids: torch.Tensor | None = None
    copied: torch.cuda.Event | None = None
    prompt_logprobs: LogprobTensors | None = None
    outcome: StepOutcome | None = None
    encoder_span: TimedSpan | None = None  # a vision-language model's encoder pass over the step's new images

    @property
    def arriving(self) -> Future | None:
        """On a pipeline stage before the last: done once the sampled tokens have come from the last stage."""
        return None if self.sample is None else self.sample.arriving

    def ready(self) -> bool:
        """Whether the sampled tokens are on the host (a query that never blocks)."""
        arrived = self.arriving is None or self.arriving.done()
        return arrived and (self.copied is None or self.copied.query())

    def wait(self) -> None:
        """Blocks until the sampled tokens are on the host."""
        if self.arriving is not None:
            self.arriving.result()
        if self.copied is not None:
            self.copied.synchronize()


class ModelRunner:
    """Turns a StepPlan into tensors, runs the model over every scheduled token at once, and samples.

    launch() queues a step's work without waiting for the device, so the host prepares step N + 1 while step N runs;
    finish() collects a launched step's outcome. Steps finish in launch order. With a draft model (`drafter`), its
    proposals are made at the start of each step and verified in the same pass as ngram's. The model runs through
    `forward`'s CUDA graphs. A decode step of requests of the decode step before it builds no inputs on the host
    (decode_continuation).
    """

    def __init__(self, forward: ForwardPass, block_size: int, device: torch.device, sampler: StepSampler,
                 drafter: DraftProposer | None = None):
        self.forward = forward
        self.model = forward.model
        self.decode_graphs = forward.decode_graphs
        self.kv_caches = forward.kv_caches
        self.device = device
        self.batch = BatchState()
        attention = forward.model.layers[0].self_attn
        self.inputs = StepInputBuilder(block_size, device,
                                       rows_per_program(attention.num_heads, attention.num_kv_heads))
        self.images = ImageInputs(forward.model, device) if forward.model.takes_images else None
        self.sampler = sampler
        self.drafter = drafter
        self._previous: SampledTokens | None = None
        self._continuation: DecodeContinuation | None = None  # the last step, when the next may continue it
        self._unfinished: deque[LaunchedStep] = deque()  # launched and not finished, oldest first
        self._stream = torch.cuda.current_stream(device) if device.type == "cuda" else None

    @torch.inference_mode()
    def launch(self, plan: StepPlan) -> LaunchedStep:
        if self._unfinished and self.sampler.grammars.active:
            self.finish(self._unfinished[-1])  # grammar matchers advance on the host before the next mask
        self.batch.apply(plan)
        encoder_span = None if self.images is None else self.images.apply(plan, self.batch)
        self.sampler.apply(plan)
        if plan.block_copies:
            copy_blocks(self.kv_caches, plan.block_copies)
            if self.drafter is not None:
                copy_blocks(self.drafter.kv_caches, plan.block_copies)
        if not plan.num_scheduled_tokens:
            return LaunchedStep(plan.step_id, outcome=StepOutcome(plan.step_id, {}))
        request_ids = list(plan.num_scheduled_tokens)
        states = [self.batch.requests[request_id] for request_id in request_ids]
        continuation = self._continuation
        if continuation is not None and continuation.continued_by(plan, states, self.decode_graphs):
            rows, sampling_rows = continuation.prepare(plan, request_ids, self.decode_graphs)
            num_proposed = plan.num_proposed
            logits = self.forward.replay_decode(max(state.num_tokens + num_proposed.get(request_id, 0)
                                                    for request_id, state in zip(request_ids, states)))
            drafts, prompt_logprobs, decode_graph = None, None, True
        else:
            self._finish_for_host_inputs(states)
            rows, inputs, drafts = self._inputs(plan, request_ids, states)
            logits, prompt_logprobs = self._logits(inputs, rows)
            sampling_rows = inputs.sampling_rows
            decode_graph = not rows.prompt_groups and inputs.images is None \
                and self.forward.fits_decode_graph(inputs.meta)
        sample = self.sampler.sample(logits, rows.sample_request_ids, sampling_rows, plan.spec_token_ids, drafts)
        self._continuation = None
        every_request_sampled = len(rows.sample_request_ids) == len(request_ids)  # then in the graph rows' order
        if decode_graph and every_request_sampled and self.drafter is None:
            if plan.num_proposed:  # a verification laid out as decode rows: keep each request's last accepted row
                self.decode_graphs.move_rows(sample.last_accepted_rows)
            self._continuation = DecodeContinuation(plan.step_id, request_ids, sampling_rows, sample)
        sampled = [self.batch.requests[request_id] for request_id in rows.sample_request_ids]
        self.batch.record_launch(plan, states, sampled)
        self._previous = SampledTokens(plan.step_id, sample.token_ids)
        step = LaunchedStep(plan.step_id, sample, sampled, prompt_logprobs=prompt_logprobs, encoder_span=encoder_span)
        results = [sample.token_ids] if sample.num_accepted is None else [sample.token_ids, sample.num_accepted]
        if drafts is not None:
            results.append(drafts.token_ids.flatten())
        results = results[0] if len(results) == 1 else torch.cat(results)
        if self.device.type == "cuda":
            step.host_token_ids = results.to("cpu", non_blocking=True)
            if sample.logprobs is not None:
                sample.logprobs = sample.logprobs.on_host()
            if prompt_logprobs is not None:
                step.prompt_logprobs = prompt_logprobs.on_host()
            step.copied = torch.cuda.Event()
            step.copied.record(self._stream)
        else:
            step.host_token_ids = results
        self._unfinished.append(step)
        return step

    def finish(self, step: LaunchedStep) -> StepOutcome:
        """The step's outcome; steps launched before it are finished first."""
        while step.outcome is None:
            oldest = self._unfinished.popleft()
            oldest.wait()
            results = oldest.host_token_ids.tolist()
            num_sampled = len(oldest.sampled)
            token_ids, num_accepted = results[:num_sampled], results[num_sampled:2 * num_sampled]
            if oldest.sample.drafts is not None:
                oldest.sample.spec_token_ids = oldest.sample.drafts.on_host(results[2 * num_sampled:])
            result = self.sampler.finish(oldest.sample, token_ids, num_accepted)
            accepted = result.accepted_token_ids
            self.batch.resolve(oldest.sampled, oldest.sample.request_ids, token_ids, oldest.sample.spec_token_ids,
                               accepted)
            prompt_logprobs = LogprobRows() if oldest.prompt_logprobs is None else oldest.prompt_logprobs.rows()
            oldest.outcome = StepOutcome(oldest.step_id, result.sampled_token_ids, result.logprobs,
                                         prompt_logprobs, result.grammar_completed_request_ids,
                                         result.grammar_errors, accepted)
        return step.outcome

    def _finish_for_host_inputs(self, states: list[RequestState]) -> None:
        """Inputs built on the host need each request's proposals verified (its position) and its newest token on
        the host or among the previous step's samples: finishes the steps that still hold either (a request whose
        decode followed its verification on the device, then skipped a step; on the CPU, a pipeline stage before the
        last whose previous step's samples are still on their way)."""
        previous = -1 if self._previous is None else self._previous.step_id
        arriving = bool(self._unfinished) and self._unfinished[-1].arriving is not None
        needed = [state.sampled_step for state in states
                  if state.num_unverified or (state.num_unresolved and (state.sampled_step != previous or arriving))]
        if needed:
            newest = max(needed)
            self.finish(next(step for step in self._unfinished if step.step_id == newest))

    def _inputs(self, plan: StepPlan, request_ids: list[str],
                states: list[RequestState]) -> tuple[LogitsRows, StepInputs, Drafts | None]:
        """The step's logits rows and model inputs, built on the host; with a draft model, its proposals."""
        query_lens = list(plan.num_scheduled_tokens.values())
        drafts = None
        if self.drafter is not None:
            drafts = self.drafter.propose(self.batch, request_ids, states, query_lens, plan.num_draft_tokens,
                                          self.sampler.rows, self._previous)
        # a draft model's proposals are on the device: zeros hold their places until _place_drafts fills them
        proposals = plan.spec_token_ids or {request_id: [0] * count for request_id, count in
                                            plan.num_draft_tokens.items()}
        rows = logits_rows(request_ids, states, query_lens, plan.num_proposed)
        position_deltas = None
        if self.images is not None and any(state.position_delta for state in states):
            position_deltas = [state.position_delta for state in states]
        inputs = self.inputs.build(self.batch, states, query_lens, rows.token_indices,
                                   self.sampler.rows.indices(rows.sample_request_ids), self._previous,
                                   [proposals.get(request_id, ()) for request_id in request_ids] if proposals else None,
                                   position_deltas=position_deltas)
        if drafts is not None:
            self._place_drafts(inputs.input_ids, drafts, request_ids, query_lens)
        if self.images is not None:
            inputs.images = self.images.step_inputs(states, query_lens)
        return rows, inputs, drafts

    def _logits(self, inputs: StepInputs, rows: LogitsRows) -> tuple[torch.Tensor, LogprobTensors | None]:
        """The sampling rows' logits and, where asked, the prompt rows' logprobs."""
        if not rows.prompt_groups:
            at_every_token = rows.token_indices == list(range(inputs.input_ids.shape[0]))
            return self.forward.logits(inputs.token_inputs, inputs.meta,
                                       None if at_every_token else inputs.logits_indices, inputs.images,
                                       inputs.position_deltas), None
        x, residual = self.forward.hidden_states(inputs.token_inputs, inputs.meta, inputs.logits_indices,
                                                 inputs.images, inputs.position_deltas)
        num_samples = rows.num_sample_rows
        return (self.model.logits(x[:num_samples], residual[:num_samples]),
                self._prompt_logprobs(x[num_samples:], residual[num_samples:], rows))

    def _place_drafts(self, input_ids: torch.Tensor, drafts: Drafts, request_ids: list[str],
                      query_lens: list[int]) -> None:
        """Writes the draft model's proposals into the step's input ids, after each drafting request's newest token
        (its chunk is the newest token and the proposals' slots)."""
        starts = dict(zip(request_ids, accumulate(query_lens, initial=0)))
        destinations = [starts[request_id] + 1 + j for request_id, count in zip(drafts.request_ids, drafts.counts)
                        for j in range(count)]
        sources = drafts.flat_indices()
        destinations_t, sources_t = upload(destinations + sources, torch.int64, self.device).split_with_sizes(
            [len(destinations), len(sources)])
        input_ids.index_copy_(0, destinations_t, drafts.token_ids.flatten().index_select(0, sources_t))

    def _prompt_logprobs(self, x: torch.Tensor, residual: torch.Tensor, rows: LogitsRows) -> LogprobTensors | None:
        """The prompt rows' logprobs, PROMPT_LOGPROB_ROWS rows of logits at a time (every rank projects them)."""
        num_top = max(num_top for _, _, num_top in rows.prompt_groups)
        parts = [self.sampler.prompt_logprobs(self.model.logits(x[start:start + PROMPT_LOGPROB_ROWS],
                                                                residual[start:start + PROMPT_LOGPROB_ROWS]),
                                              rows.prompt_targets[start:start + PROMPT_LOGPROB_ROWS], num_top)
                 for start in range(0, len(rows.prompt_targets), PROMPT_LOGPROB_ROWS)]
        return None if parts[0] is None else joined(parts, rows.prompt_groups)
