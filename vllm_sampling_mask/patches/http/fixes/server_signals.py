"""On SIGTERM the API server stops its engine client before it stops serving HTTP
(vLLM 0.24).

What: `serve_http` (vllm/entrypoints/launcher.py) builds its HTTP server as
    `uvicorn.Server(config)`. The patch rebinds that module's name `uvicorn` to a
    view of uvicorn whose `Server` installs no SIGINT/SIGTERM handlers of its own
    (its `capture_signals` enters nothing); every other name is uvicorn's. The
    handlers `serve_http` registers on its event loop are then the only ones: on
    SIGTERM they stop the engine client (draining, with `--shutdown-timeout`),
    log `[shutdown] API server: engine client stopped`, and only then stop the
    HTTP server. Applies with the mask flag on or off.
Why: 0.24 registers its loop handlers before the server task has run, and
    `uvicorn.Server.serve` then installs uvicorn's own over them with
    `signal.signal`; the loop's wake-up descriptor still reports the signal, so
    both run. uvicorn closes the listening socket at once (a request sent while
    the engine core drains, `/health` included, finds the port closed) and, once
    its connections are done, ends `serve_http`, whose `finally` cancels vLLM's
    shutdown task before it logs that the engine client stopped (that shutdown
    runs on in the executor; found by tests/server/test_faults.py's SIGTERM runs).
Upstream: vLLM #49668 (0.27.1 registers its handlers once uvicorn has started),
    #50916 (0.28 builds a uvicorn server that installs none).
"""

from __future__ import annotations

import contextlib
import types

from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    uvicorn = module.uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, leaving SIGINT and SIGTERM to the handlers
        `serve_http` registers on its event loop."""

        def capture_signals(self):
            return contextlib.nullcontext()

    class UvicornView(types.ModuleType):
        """uvicorn as `serve_http` reads it: its own names, but `Server`."""

        def __getattr__(self, name):
            return getattr(uvicorn, name)

    view = UvicornView(uvicorn.__name__, uvicorn.__doc__)
    view.Server = Server
    module.uvicorn = view
