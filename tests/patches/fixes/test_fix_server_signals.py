"""The fix `server_signals` (0.24): the HTTP server leaves SIGINT/SIGTERM to vLLM's own
handlers. No engine (the SIGTERM end to end: tests/server/test_faults.py)."""

from __future__ import annotations

import pytest
from fastapi import FastAPI

from vllm_sampling_mask.patches import apply as patching

pytestmark = pytest.mark.release_tier  # CI runs it on every release


def test_the_http_server_leaves_sigterm_to_vllms_own_handlers():
    """The `server_signals` patch (0.24): the uvicorn server `serve_http` builds
    installs no SIGINT/SIGTERM handler of its own, so on SIGTERM vLLM's handlers
    stop the engine client before the HTTP server stops (uvicorn's own closed the
    port at once). Every other uvicorn name `serve_http` reads is uvicorn's."""
    import importlib
    import signal

    import uvicorn

    from vllm_sampling_mask.patches import REGISTRY

    release, record = patching.upstream_release(), REGISTRY["server_signals"]
    if not record.applies_to(release):
        pytest.skip(f"a 0.24 patch (this is vLLM {release.version}): 0.27.1 registers "
                    "its handlers after uvicorn's (vLLM #49668), 0.28 on builds a server "
                    "that installs none (#50916)")
    patching.apply_all()
    launcher = importlib.import_module(record.targets_for(release)[0])
    server = launcher.uvicorn.Server(uvicorn.Config(FastAPI()))
    assert isinstance(server, uvicorn.Server) and launcher.uvicorn.Config is uvicorn.Config
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with server.capture_signals():
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    # stock uvicorn takes SIGTERM over inside the same block (what the patch prevents)
    with uvicorn.Server(uvicorn.Config(FastAPI())).capture_signals():
        assert signal.getsignal(signal.SIGTERM) != before[0]
