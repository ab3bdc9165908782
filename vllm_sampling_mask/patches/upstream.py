"""What the records of several hops name: upstream modules, releases and shared texts.

Plain data (`patches.schema`'s entry constructors, no vLLM): each hop's `records` module
imports what it names from here; a name only one hop uses is written in that hop's module.
"""

from __future__ import annotations

MASK_PR = "vLLM #49577 (sampling masks, 0.28; GPU compaction #54901)"

NONE_KNOWN = "none known; would file: "

RUNNER_V2 = "vllm.v1.worker.gpu"

V1_RUNNER = "vllm.v1.worker.gpu_model_runner"

OPENAI_COMPLETION = "vllm.entrypoints.openai.completion"

OPENAI_CHAT = "vllm.entrypoints.openai.chat_completion"

ASYNC_LLM = "vllm.v1.engine.async_llm"

OUTPUT_PROCESSOR = "vllm.v1.engine.output_processor"
