"""Upstream names the patches import whose module differs between vLLM releases.

One table, one look-up: a patch asks `upstream("ErrorResponse")` instead of
importing from a release's path. The seam contract lists the same places
(`seams.py`), so a release that moves one again fails the contract test first.
"""

from __future__ import annotations

import importlib

# name -> {release: the module that defines it}
LOCATIONS: dict[str, dict[str, str]] = {
    "ErrorResponse": {"0.27.1": "vllm.entrypoints.openai.engine.protocol",
                      "0.32.0": "vllm.entrypoints.serve.engine.protocol"},
    # `vllm serve`'s argument parser and app (the tests build an app without an engine)
    "make_arg_parser": {"0.27.1": "vllm.entrypoints.openai.cli_args",
                        "0.32.0": "vllm.entrypoints.launchers.cli_args"},
    "build_app": {"0.27.1": "vllm.entrypoints.openai.api_server",
                  "0.32.0": "vllm.entrypoints.launchers.app"},
}


def upstream(name: str):
    """The object `name` of the installed vLLM release."""
    from vllm_sampling_mask.patching import upstream_release

    return getattr(importlib.import_module(LOCATIONS[name][upstream_release()]), name)
