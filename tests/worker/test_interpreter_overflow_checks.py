"""`interpreter_overflow_checks`: Triton's interpreter runs 32-bit integer arithmetic
without the overflow checks whose assert is off, and a kernel's results do not change.

The kernel is a murmur3-style mix (multiplies and adds that wrap around in int32, as
MRv2's Gumbel hash does), checked against numpy's uint32 arithmetic; the interpreter's
`device_assert` is counted: the overflow checks are what call it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from vllm_sampling_mask.config import triton_interpreter_on

triton = pytest.importorskip("triton", reason="Triton is not installed")
if not triton_interpreter_on():
    pytest.skip("runs under Triton's interpreter (TRITON_INTERPRET=1, which the suite "
                "sets on a host without CUDA)", allow_module_level=True)

import triton.language as tl  # noqa: E402
from triton.language import semantic  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

C1, C2 = -862048943, 461845907          # 0xcc9e2d51 and 0x1b873593 as int32


@triton.jit
def _mix(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    keep = offs < n
    h = tl.load(x_ptr + offs, mask=keep, other=0)
    for _ in range(3):
        h = h * C1
        h = (h << 15) | ((h >> 17) & 0x7FFF)
        h = h * C2 + 0x6B64E654
    tl.store(out_ptr + offs, h, mask=keep)


def _reference(x: np.ndarray) -> np.ndarray:
    h = x.astype(np.uint32)
    for _ in range(3):
        h = h * np.uint32(C1 & 0xFFFFFFFF)
        h = (h << np.uint32(15)) | ((h >> np.uint32(17)) & np.uint32(0x7FFF))
        h = h * np.uint32(C2) + np.uint32(0x6B64E654)
    return h.view(np.int32)


def _run(monkeypatch, x: torch.Tensor) -> tuple[np.ndarray, int]:
    calls = []
    original = semantic.TritonSemantic.device_assert

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(semantic.TritonSemantic, "device_assert", counted)
    out = torch.empty_like(x)
    _mix[(1,)](x, out, x.numel(), BLOCK=64)
    monkeypatch.undo()
    return out.numpy(), len(calls)


@pytest.fixture
def x():
    return torch.arange(-32, 32, dtype=torch.int32) * 977_321


def test_the_interpreter_runs_without_the_dead_overflow_checks(monkeypatch, x):
    options = interpreter.interpreter_builder.options
    assert not options.debug and not options.sanitize_overflow
    out, asserts = _run(monkeypatch, x)
    assert asserts == 0
    np.testing.assert_array_equal(out, _reference(x.numpy()))


def test_with_the_checks_on_the_results_are_the_same(monkeypatch, x):
    """Triton's default (the checks computed, their assert off): same results, and the
    checks ran (the count the patch brings to 0)."""
    builder = interpreter.interpreter_builder
    saved = builder.options
    builder.options = dataclasses.replace(saved, sanitize_overflow=True)
    try:
        out, asserts = _run(monkeypatch, x)
    finally:
        builder.options = saved
    assert asserts >= 6      # three rounds of two wrapping multiplies, at least
    np.testing.assert_array_equal(out, _reference(x.numpy()))
