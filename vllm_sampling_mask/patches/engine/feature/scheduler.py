"""Slice each step's masks per request into the engine-core outputs.

What it wraps, in `vllm/v1/core/sched/scheduler.py`, beside making the scheduler build
`engine.outputs.MaskedEngineCoreOutput` (trailing mask fields):

- `Scheduler.update_from_output`: after upstream cut each request's new tokens, gives
  each output of a request that wants a mask the support of exactly the tokens it kept
  (byte slices of the step's flat arrays, `transport.WireRows`), or ends that request
  alone (finish reason ERROR, `sampling_mask_error`) when its rows cannot describe its
  draw.

Why: the scheduler is where runner rows become per-request outputs; slicing after
upstream keeps the mask aligned with `new_token_ids` by construction.
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.config import mask_enabled
from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.transport import NO_MASKS
from vllm_sampling_mask.frontend.validation import dropped_reason, mask_is_optional
from vllm_sampling_mask.engine.outputs import MaskedEngineCoreOutput


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
        if model_runner_output.sampling_mask_step is NO_MASKS:
            return wrapped(*args, **kwargs)   # no row of the step wanted a mask
        # the requests as they were before upstream frees the ones this step finishes
        # (a copy made in C; looked up only for a request whose step has a problem)
        requests = dict(self.requests)
        outputs = wrapped(*args, **kwargs)
        masks = model_runner_output.sampling_mask_step
        with_tokens = [out for engine_outputs in outputs.values()
                       for out in engine_outputs.outputs if out.new_token_ids]
        if not with_tokens:
            return outputs
        if masks is None:   # a step with tokens always carries its masks
            raise MissingSamplingMaskError(
                "Scheduler.update_from_output",
                f"request {with_tokens[0].request_id} got tokens but "
                "ModelRunnerOutput.sampling_mask_step is None")
        failed = []
        for out, problem in _attach(with_tokens, masks, _rows(model_runner_output),
                                    logger):
            request = requests.get(out.request_id)
            if (request is not None and request.sampling_params is not None
                    and mask_is_optional(request.sampling_params)):
                # never asked for (its switch null): it keeps its token and sets
                # `sampling_mask_reason`; the output processor serves that token and
                # every later one without a mask. Never end the request.
                logger.info("sampling mask: request %s goes on without a mask: %s",
                            out.request_id, problem)
                drop(out, problem)
            else:   # no unmasked token; the rest of the batch and the engine go on
                fail(out, problem)

                failed.append(out.request_id)
        if failed:
            self.finish_requests(failed, RequestStatus.FINISHED_ERROR)
        return outputs


def _rows(model_runner_output) -> dict:
    """Request id -> its row of the step: `req_id_to_index` up to 0.33, the order of
    `req_ids` from 0.34 (which dropped the mapping)."""
    index = getattr(model_runner_output, "req_id_to_index", None)
    if index is None:
        index = {req_id: i for i, req_id in enumerate(model_runner_output.req_ids)}
    return index


def _attach(outs: list, masks, index: dict, logger) -> list:
    """Put, on each output (with tokens) of a request that wants a mask, the bytes
    of the rows of the tokens it kept (one row per token: under speculative
    decoding a request keeps up to its draft positions plus one); return
    (output, problem) for those whose rows cannot describe their draws. A step
    whose worker checked each row against the token it drew (`StepMasks.drawn`)
    takes an output whose one kept token is that token as it is; the others,
    and every output of other steps, are checked over the step at once
    (`StepMasks.suspects`); only a suspect output is looked at alone."""
    for out in outs:
        if not isinstance(out, MaskedEngineCoreOutput):
            raise MissingSamplingMaskError(
                "Scheduler.update_from_output", f"the output of request {out.request_id} "
                f"is a {type(out).__name__}, which has no mask fields")
    wire = masks.wire()
    if wire.drawn is not None and masks.first_row is None:
        outs = _attach_drawn(outs, wire, index)
        if not outs:
            return []
    return _attach_checked(outs, masks, wire, index, logger)


def _attach_drawn(outs: list, wire, index: dict) -> list:
    """Attach the rows of the outputs whose one kept token is the token their
    row was checked against in the worker; return the outputs left to check."""
    row_of, drawn = wire.row_of, wire.drawn
    unchecked = []
    for out in outs:
        i = index[out.request_id]
        r = row_of[i]
        if r < 0:
            continue     # asked for no mask
        kept = out.new_token_ids
        if len(kept) == 1 and kept[0] == drawn[r]:
            (out.sampling_mask_ids, out.sampling_mask_counts,
             out.sampling_mask_logprobs, out.sampling_mask_log_kept) = wire.of(i)
        else:
            unchecked.append(out)
    return unchecked


def _attach_checked(outs: list, masks, wire, index: dict, logger) -> list:
    """`_attach` for outputs whose kept tokens have not been checked yet."""
    requests = np.fromiter((index[out.request_id] for out in outs), np.int64, len(outs))
    first = requests if masks.first_row is None else masks.first_row[requests]
    wanted = np.flatnonzero(masks.row_of[first] >= 0)   # the others asked for no mask
    if not len(wanted):
        return []
    kept = [outs[j].new_token_ids for j in wanted.tolist()]
    lengths = np.fromiter(map(len, kept), np.int64, len(kept))
    if masks.first_row is None:
        room = np.ones(len(kept), dtype=np.int64)
    else:
        ends = np.append(masks.first_row[1:], len(masks.row_of))
        room = (ends - masks.first_row)[requests[wanted]]
    fits = lengths <= room
    # one (batch row, token) per kept token of the outputs whose tokens fit their rows
    n = np.where(fits, lengths, 0)
    if (n == 1).all():    # one token each (every step without speculative decoding)
        rows = first[wanted]
        tokens = np.fromiter((ids[0] for ids in kept), np.int64, len(kept))
    else:
        rows = (np.repeat(first[wanted] - np.cumsum(n) + n, n)
                + np.arange(int(n.sum()), dtype=np.int64))
        tokens = np.fromiter((t for ids, f in zip(kept, fits) if f for t in ids), np.int64,
                             int(n.sum()))
    bad = masks.suspects(rows, tokens)
    suspect = np.zeros(len(kept), dtype=bool)
    if bad.any():
        owner = np.repeat(np.arange(len(kept)), n)
        suspect[owner[bad]] = True
    problems = []
    for j, ids, length, fit, is_suspect, start in zip(
            wanted.tolist(), kept, lengths.tolist(), fits.tolist(), suspect.tolist(),
            first[wanted].tolist()):
        out = outs[j]
        try:
            problem = None
            if not fit:
                problem = (f"{length} tokens in one step, more than the positions it "
                           "sampled (one without speculative decoding, its drafts plus "
                           "one with)")
            elif is_suspect:
                problem = next(filter(None, (masks.problem(row, token) for row, token
                                              in zip(range(start, start + length), ids))),
                               None)
            if problem is None:
                (out.sampling_mask_ids, out.sampling_mask_counts,
                 out.sampling_mask_logprobs, out.sampling_mask_log_kept) = wire.of(start, length)
        except Exception as exc:  # one request's bad rows, not the engine's
            logger.exception("sampling mask: request %s", out.request_id)
            problem = f"internal error while slicing its mask: {exc!r}"
        if problem is not None:
            problems.append((out, problem))
    return problems
