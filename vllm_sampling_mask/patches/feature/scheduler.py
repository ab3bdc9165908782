"""Slice each step's masks per request into the engine-core outputs.

What: in `vllm/v1/core/sched/scheduler.py`, makes the scheduler build
    `wire.MaskedEngineCoreOutput` (a subclass with trailing mask fields) and
    wraps `Scheduler.update_from_output`: after upstream has cut each
    request's new tokens (stop tokens, max_tokens, preemption, aborts), each
    output of a request that wants a mask gets the support of exactly the
    token it kept (others get none), as byte slices of the step's flat arrays
    (`transport.WireRows`: the arrays turn to bytes once a step; raw bytes cost
    the engine core's encoder nothing per output). The step's rows are checked
    at once (`StepMasks.suspects`); only a suspect row is looked at alone. A row that cannot
    describe its draw exactly (a wide row that found no slot, an empty
    support, a sampled token outside its support, more than one token, or
    anything unexpected) ends *that request* with finish reason ERROR and
    `sampling_mask_error` saying why, carrying no unmasked token; the rest of
    the batch and the engine go on. A request whose mask was decided by
    default (its switch null: `validation.mask_is_optional`, read from a
    copy of `Scheduler.requests` taken before upstream frees the step's finished
    ones) is never ended by the mask path: the same problem
    keeps its token and sets `sampling_mask_reason` instead, and the output
    processor serves that token and every later one without a mask. A step with tokens but no
    `ModelRunnerOutput.sampling_mask_step` raises `MissingSamplingMaskError`.
Why: the scheduler is where per-step runner rows become per-request outputs;
    slicing after upstream keeps the mask aligned with `new_token_ids` by
    construction, and it can finish a single request cleanly. A request that
    asked for support logprobs also gets `sampling_mask_logprobs` (aligned with
    the ids) and `sampling_mask_log_kept`.
Remove when: upstream's `EngineCoreOutput` mask (vLLM #49577, since 0.28) carries
    the overlay's block, the size-limit reason and the support logprobs; from 0.28
    this replaces upstream's slicing.
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.config import mask_enabled
from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.validation import dropped_reason, mask_is_optional
from vllm_sampling_mask.wire import MaskedEngineCoreOutput


def apply(module, release: Release) -> None:
    from vllm.logger import init_logger
    from vllm.v1.engine import FinishReason
    from vllm.v1.request import RequestStatus

    logger = init_logger("vllm.sampling_mask")
    module.EngineCoreOutput = MaskedEngineCoreOutput

    def fail(out: MaskedEngineCoreOutput, message: str) -> None:
        logger.error("sampling mask: request %s ended: %s", out.request_id, message)
        out.new_token_ids = []
        out.new_logprobs = None
        out.finish_reason = FinishReason.ERROR
        out.stop_reason = None
        out.sampling_mask_error = f"sampling mask: {message}"

    def drop(out: MaskedEngineCoreOutput, problem: str) -> None:
        out.sampling_mask_ids = out.sampling_mask_counts = None
        out.sampling_mask_logprobs = out.sampling_mask_log_kept = None
        out.sampling_mask_reason = dropped_reason(problem)

    @wraps(module, "Scheduler.update_from_output")
    def update_from_output(wrapped, self, args, kwargs):
        if not mask_enabled(self.vllm_config):
            return wrapped(*args, **kwargs)
        model_runner_output = argument(wrapped, args, kwargs, "model_runner_output")
        # the requests as they were before upstream frees the ones this step finishes
        # (a copy made in C; looked up only for a request whose step has a problem)
        requests = dict(self.requests)
        outputs = wrapped(*args, **kwargs)
        masks = model_runner_output.sampling_mask_step
        with_tokens = [out for engine_outputs in outputs.values()
                       for out in engine_outputs.outputs if out.new_token_ids]
        if not with_tokens:
            return outputs
        if masks is None:
            raise MissingSamplingMaskError(
                "Scheduler.update_from_output",
                f"request {with_tokens[0].request_id} got tokens but "
                "ModelRunnerOutput.sampling_mask_step is None")
        failed = []
        for out, problem in _attach(with_tokens, masks, model_runner_output.req_id_to_index,
                                    logger):
            request = requests.get(out.request_id)
            if (request is not None and request.sampling_params is not None
                    and mask_is_optional(request.sampling_params)):
                # never asked for: serve on without a mask, never end the request
                logger.info("sampling mask: request %s goes on without a mask: %s",
                            out.request_id, problem)
                drop(out, problem)
            else:
                fail(out, problem)
                failed.append(out.request_id)
        if failed:
            self.finish_requests(failed, RequestStatus.FINISHED_ERROR)
        return outputs


def _attach(outs: list, masks, index: dict, logger) -> list:
    """Put, on each output (with tokens) of a request that wants a mask, the bytes
    of its row of the step's masks; return (output, problem) for those whose row
    cannot describe their draw. The checks run over the step's rows at once
    (`StepMasks.suspects`); only a suspect row is looked at alone."""
    for out in outs:
        if not isinstance(out, MaskedEngineCoreOutput):
            raise MissingSamplingMaskError(
                "Scheduler.update_from_output", f"the output of request {out.request_id} "
                f"is a {type(out).__name__}, which has no mask fields")
    rows = np.fromiter((index[out.request_id] for out in outs), np.int64, len(outs))
    wanted = np.flatnonzero(masks.row_of[rows] >= 0)   # the others asked for no mask
    if not len(wanted):
        return []
    tokens = np.fromiter((outs[j].new_token_ids[0] for j in wanted), np.int64, len(wanted))
    suspects = masks.suspects(rows[wanted], tokens).tolist()
    wire = masks.wire()
    problems = []
    for j, suspect in zip(wanted.tolist(), suspects):
        out, row = outs[j], int(rows[j])
        try:
            problem = None
            if len(out.new_token_ids) != 1:
                problem = (f"{len(out.new_token_ids)} tokens in one step; without "
                           "speculative decoding the sampler draws one")
            elif suspect:
                problem = masks.problem(row, out.new_token_ids[0])
            if problem is None:
                (out.sampling_mask_ids, out.sampling_mask_counts,
                 out.sampling_mask_logprobs, out.sampling_mask_log_kept) = wire.of(row)
        except Exception as exc:  # one request's bad row, not the engine's
            logger.exception("sampling mask: request %s", out.request_id)
            problem = f"internal error while slicing its mask: {exc!r}"
        if problem is not None:
            problems.append((out, problem))
    return problems
