"""Checks shared by the tests of the RL routes' refusals on conftest's dev-mode
`mask_server` (tests/http/test_rl_route_bodies.py and the fixes' own files in
tests/patches/fixes/): a refusal is a 400 naming its parameter, and after the bad
calls the server is healthy, not paused, and a seeded masked request gives what it
gave before them."""

from __future__ import annotations

import requests
from rl_http import Stream

SEED = 31


def seeded_run(base: str) -> tuple[list[int], list[list[int]]]:
    """The seeded masked request's tokens and masks (read before a module's bad calls,
    compared after them by `serves_as_before`)."""
    ids, masks, finish = Stream(base, seed=SEED).join()
    assert finish == "length"
    return ids, masks


def refused(r: requests.Response, parameter: str, *words: str) -> None:
    """`r` is a 400 without a traceback whose error names `parameter` and says each
    of `words`."""
    assert r.status_code == 400, (r.status_code, r.text[:400])
    assert "Traceback" not in r.text
    error = r.json()["error"]
    assert error["param"] == parameter, error
    for word in words:
        assert word in error["message"], (word, error["message"])


def serves_as_before(base: str, before) -> None:
    assert requests.get(base + "/health", timeout=60).status_code == 200
    assert requests.get(base + "/is_paused", timeout=60).json() == {"is_paused": False}
    ids, masks, finish = Stream(base, seed=SEED).join()
    assert (ids, masks, finish) == (*before, "length")
