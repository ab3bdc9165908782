"""Triton functions that stand in for libdevice under Triton's interpreter.

Imported only when TRITON_INTERPRET=1 (see patches/worker/enablers/interpreter_libdevice.py).
`triton.language` must be a global of this module: the interpreter finds it
through each jitted function's globals.
"""

import triton
import triton.language as tl


@triton.jit
def log1p(x):
    # Goldberg's accurate log1p: log(u) * x / (u - 1) with u = 1 + x; exact at u == 1.
    u = 1.0 + x
    d = tl.where(u == 1.0, 1.0, u - 1.0)
    return tl.where(u == 1.0, x, tl.log(u) * (x / d))
