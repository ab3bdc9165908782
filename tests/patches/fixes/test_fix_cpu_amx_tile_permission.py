"""The fix `cpu_amx_tile_permission`: every vLLM process on its CPU platform holds AMX
tile state, so a bfloat16 model (vLLM's CPU default for a float32 checkpoint) runs on a
CPU with AMX instead of dying with SIGILL.

On a CPU without AMX the permission checks skip, saying so; the plain module's request
is still checked against the real kernel there (it refuses, and nothing raises), and
the default-dtype engine still has to generate with masks.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
from test_readme import clean_env

from vllm_sampling_mask.worker import cpu_amx

pytestmark = pytest.mark.skipif(not cpu_amx.linux_x86_64(),
                                reason="AMX tile state is a Linux x86-64 request")


def _torch_amx() -> bool:
    import torch
    return bool(torch.cpu._is_amx_tile_supported())


HAS_AMX = cpu_amx.linux_x86_64() and (cpu_amx.cpu_advertises_amx() or _torch_amx())
NO_AMX = "this CPU has no AMX (no amx_tile in /proc/cpuinfo, torch agrees): nothing to grant"


def _python(code: str, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)


_PERMISSION_PROBE = """
    import json
    import vllm
    from vllm.platforms import current_platform
    from vllm_sampling_mask.worker import cpu_amx
    cpu = current_platform.is_cpu()     # resolving the platform imports its module
    print(json.dumps({"cpu": cpu, "permitted": cpu_amx.tile_data_permitted()}))
"""


@pytest.mark.release_tier
@pytest.mark.skipif(not HAS_AMX, reason=NO_AMX)
def test_a_vllm_process_on_the_cpu_platform_holds_amx_tile_state():
    env = clean_env()
    r = _python(_PERMISSION_PROBE, env)
    assert r.returncode == 0, r.stderr[-3000:]
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    assert facts == {"cpu": True, "permitted": True}, facts
    # stock vLLM does not ask (the bug): without the overlay the same process has no grant
    stock = _python(_PERMISSION_PROBE, {**env, "VLLM_SAMPLING_MASK_DISABLE": "1"})
    assert stock.returncode == 0, stock.stderr[-3000:]
    assert json.loads(stock.stdout.strip().splitlines()[-1])["permitted"] is False, (
        "stock vLLM already holds AMX tile state here: the fix's remove-when may hold")


@pytest.mark.release_tier
def test_the_request_against_this_kernel_grants_or_refuses_without_raising():
    """The plain module's request, in a fresh interpreter (no vLLM, no torch), as this
    host's kernel answers it: granted once on a CPU with AMX, refused on one without."""
    r = _python("""
        import json
        from vllm_sampling_mask.worker import cpu_amx
        before = cpu_amx.tile_data_permitted()
        plain = cpu_amx.request_tile_data()
        forced = cpu_amx.request_tile_data(amx_advertised=True)
        print(json.dumps({"before": before, "supported": cpu_amx.tile_data_supported(),
                          "plain": plain.outcome, "forced": [forced.outcome, forced.detail],
                          "after": cpu_amx.tile_data_permitted()}))
    """, {**os.environ, "VLLM_SAMPLING_MASK_DISABLE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    assert facts["before"] is False                 # a new process holds no grant
    if facts["supported"]:                          # the kernel and CPU have AMX
        assert facts["plain"] == "granted" and facts["after"] is True
        assert facts["forced"][0] == "already-granted"     # asking again changes nothing
    else:
        assert facts["plain"] == "no-amx"           # not asked: the CPU lists no amx_tile
        outcome, detail = facts["forced"]           # asked anyway: the kernel's refusal
        assert outcome == "refused" and "ARCH_REQ_XCOMP_PERM" in detail, facts
        assert facts["after"] is False


@pytest.mark.release_tier
def test_a_refusal_is_one_warning_and_vllm_starts_on(monkeypatch, caplog):
    """The patch's request where the kernel says no (a CPU without AMX told that it
    has AMX): one warning naming the way out, no exception."""
    from vllm_sampling_mask.patches.common.fixes import cpu_amx_tile_permission as fix

    if cpu_amx.tile_data_supported():
        pytest.skip("this kernel grants AMX tile state: no refusal to see here")
    monkeypatch.setattr(cpu_amx, "cpu_advertises_amx", lambda flags=None: True)
    with caplog.at_level(logging.WARNING, logger=fix.__name__):
        result = fix.request()
    assert result.outcome == "refused" and not result.permitted
    (record,) = [r for r in caplog.records if r.name == fix.__name__]
    assert record.levelno == logging.WARNING
    assert "SIGILL" in record.getMessage() and "float32" in record.getMessage()


_DEFAULT_DTYPE_ENGINE = """
    import json
    from vllm import LLM, SamplingParams
    from vllm_sampling_mask import DEMO_MODEL

    if __name__ == "__main__":
        llm = LLM(DEMO_MODEL, return_sampling_mask=True, logprobs_mode="processed_logprobs",
                  enforce_eager=True, kv_cache_memory_bytes=1 << 30)
        params = SamplingParams(temperature=1.0, top_k=20, max_tokens=8, seed=0, logprobs=0)
        out = llm.generate(["def main():"], params)[0].outputs[0]
        print(json.dumps({"dtype": str(llm.llm_engine.model_config.dtype),
                          "tokens": list(out.token_ids),
                          "masks": [list(m) for m in out.sampling_mask.token_ids]}))
"""


def test_a_default_dtype_engine_generates_with_masks(tmp_path):
    """No `dtype`: vLLM serves the float32 demo checkpoint in bfloat16, in its own
    engine processes, as a new user's first `LLM(...)` does (on a CPU with AMX, without
    the fix, the worker dies with SIGILL)."""
    script = tmp_path / "engine.py"
    script.write_text(textwrap.dedent(_DEFAULT_DTYPE_ENGINE))
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=clean_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    # vLLM logs to stdout too, after the script's line as it shuts down
    (line,) = [l for l in r.stdout.splitlines() if l.startswith('{"dtype"')]
    facts = json.loads(line)
    assert facts["dtype"] == "torch.bfloat16"
    tokens, masks = facts["tokens"], facts["masks"]
    assert len(tokens) == len(masks) == 8
    # top_k 20: 20 ids, more where bfloat16 ties the 20th logit
    assert all(t in m and 20 <= len(m) for t, m in zip(tokens, masks)), facts
