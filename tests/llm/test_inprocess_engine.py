"""The in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) on the V1 runner,
natively: no serialisation between scheduler and client, so the mask takes the
direct path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch
from conftest import hf_logits

from vllm_sampling_mask import SamplingMask
from vllm_sampling_mask.training import nucleus_logprobs

SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from conftest import ENGINE_KWARGS
    from vllm import LLM, SamplingParams
    import vllm.v1.engine.core_client as cc
    llm = LLM(**ENGINE_KWARGS)
    assert type(llm.llm_engine.engine_core).__name__ == "InprocClient"
    runner, = llm.collective_rpc(lambda w: type(w.model_runner).__module__)
    assert runner == "vllm.v1.worker.cpu_model_runner", runner
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, max_tokens=12, n=n,
                             seed=s, logprobs=0)
              for t, k, p, n, s in [(0.8, 20, 1.0, 1, 1), (1.0, 40, 0.9, 2, 2)]]
    outs = llm.generate(["def main():\\n    ", "import os\\n"], params)
    rows = []
    for out, sp in zip(outs, params):
        for c in out.outputs:
            rows.append(dict(prompt=out.prompt_token_ids, tokens=c.token_ids,
                             ids=c.sampling_mask.ids.tolist(),
                             offsets=c.sampling_mask.offsets.tolist(),
                             logprobs=[lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)],
                             temperature=sp.temperature))
    print("RESULT " + json.dumps(rows))
""")


def test_inprocess_engine_returns_exact_masks(hf_model):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_USE_V2_MODEL_RUNNER="0")  # V1
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", SCRIPT, here], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = json.loads(next(l for l in r.stdout.splitlines()
                           if l.startswith("RESULT "))[len("RESULT "):])
    assert len(rows) == 3   # n=1 and n=2
    for row in rows:
        mask = SamplingMask(row["ids"], row["offsets"])
        assert len(mask) == len(row["tokens"]) == 12
        assert all(t in s for t, s in zip(row["tokens"], mask.token_ids))
        logits = hf_logits(hf_model, row["prompt"], row["tokens"])
        replayed = nucleus_logprobs(logits, torch.tensor(row["tokens"]), mask,
                                    temperature=row["temperature"])
        assert torch.allclose(replayed, torch.tensor(row["logprobs"]), atol=1e-4)
