"""CPU / Triton-interpreter enablers for the test suite: applied only when
TRITON_INTERPRET=1 is set (Model Runner V2 on a CPU host)."""
