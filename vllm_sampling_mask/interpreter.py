"""Helpers for running Model Runner V2 through Triton's interpreter on a CPU."""

import os


def triton_interpreter_on() -> bool:
    """True when Triton's own switch TRITON_INTERPRET=1 is set."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")
