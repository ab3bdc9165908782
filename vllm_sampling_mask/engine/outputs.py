"""The engine-core output types that carry masks across the process boundary.

`MaskedEngineCoreOutput` is vLLM's `EngineCoreOutput` (a msgspec Struct with
`array_like=True`) with trailing fields; the engine core's encoder
writes them. The client must decode with `MaskedEngineCoreOutputs`: a decoder
built for the base type silently drops trailing fields.

Per output, for its `new_token_ids` (one token per step without speculation),
the bytes of its rows of the step's flat block (little-endian, as numpy lays
them out; raw bytes cost msgspec nothing to encode and decode, where an array
field goes through vLLM's encoder hooks twice per output per step):
    sampling_mask_ids     int32 [sum of counts], supports concatenated
    sampling_mask_counts  int32 [len(new_token_ids)]
    sampling_mask_error   why the mask path ended this request (its
                          finish_reason is then ERROR and it carries no tokens)
    sampling_mask_logprobs  float32 [sum of counts], aligned with the ids: each
                          id's processed logprob (requests that asked for
                          `return_sampling_mask_logprobs`; else None)
    sampling_mask_log_kept  float32 [len(new_token_ids)], log S per token
    sampling_mask_reason  why this output's tokens, and every later one of the
                          request, carry no mask: a request that never asked for
                          one (switch null) whose step the mask could not describe
                          (its tokens are kept; the output processor stops the mask)
"""

from __future__ import annotations

from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs


class MaskedEngineCoreOutput(EngineCoreOutput):
    sampling_mask_ids: bytes | None = None
    sampling_mask_counts: bytes | None = None
    sampling_mask_error: str | None = None
    sampling_mask_logprobs: bytes | None = None
    sampling_mask_log_kept: bytes | None = None
    sampling_mask_reason: str | None = None


class MaskedEngineCoreOutputs(EngineCoreOutputs):
    outputs: list[MaskedEngineCoreOutput] = []
