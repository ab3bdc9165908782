"""On SIGTERM the API server stops its engine client before it stops serving HTTP
(vLLM 0.24).

What it replaces, in vllm/entrypoints/launcher.py, with the mask flag on or off:

- the module's name `uvicorn`, with a view of uvicorn whose `Server` installs no
  SIGINT/SIGTERM handlers: `serve_http`'s loop handlers stop the engine client
  (draining, with `--shutdown-timeout`), log `[shutdown] API server: engine client
  stopped`, and only then stop the HTTP server.

Why: on 0.24 uvicorn's own handler also ran and closed the port at once, and ended
`serve_http` before vLLM's shutdown had logged that the engine client stopped.
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

        # 0.24 registers its loop handlers before the server task has run, and
        # `uvicorn.Server.serve` then installs uvicorn's own over them with
        # `signal.signal`; the loop's wake-up descriptor still reports the signal, so
        # both ran (a request sent while the core drains, `/health` included, found the
        # port closed; `serve_http`'s `finally` cancelled vLLM's shutdown task).
        def capture_signals(self):
            return contextlib.nullcontext()


    class UvicornView(types.ModuleType):
        """uvicorn as `serve_http` reads it: its own names, but `Server`."""

        def __getattr__(self, name):
            return getattr(uvicorn, name)

    view = UvicornView(uvicorn.__name__, uvicorn.__doc__)
    view.Server = Server
    module.uvicorn = view
