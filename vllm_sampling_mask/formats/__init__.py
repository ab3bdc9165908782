"""How masks and refusals are written: the packed encoding of masks (`packed_wire`) and
the sentences of request errors (`error_sentences`). Plain modules, no vLLM import."""
