"""A custom V1 logits processor for the tests: bans the ids a request lists in
`SamplingParams.extra_args["ban_ids"]` (its logits become -inf). Engine-level,
so it lives in an importable module (the spawned worker imports it by name)."""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates


class BanIdsProcessor(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.bans: dict[int, list[int]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        process_dict_updates(
            self.bans, batch_update,
            lambda params, _prompt, _output: (params.extra_args or {}).get("ban_ids")
            if params is not None else None)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, ids in self.bans.items():
            logits[row, ids] = float("-inf")
        return logits
