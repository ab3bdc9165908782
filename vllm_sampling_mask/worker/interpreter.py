"""Helpers for running Model Runner V2 through Triton's interpreter on a CPU."""

from vllm_sampling_mask.config import triton_interpreter_on

__all__ = ["triton_interpreter_on"]
