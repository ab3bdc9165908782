"""Patches of upstream modules every vLLM process may import (configuration, output
types, the platform): CPU / Triton-interpreter enablers, applied only with
TRITON_INTERPRET=1."""
