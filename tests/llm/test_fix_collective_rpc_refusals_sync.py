"""The fix `collective_rpc_refusals_sync`: a failed weight reload through
`LLM.collective_rpc("reload_weights", ...)` raises the overlay's own errors, a refusal
a `ValueError` with its one line, and loses nothing (`reload_weights_recovery`, whose
file over HTTP is tests/server/test_fix_reload_weights_recovery.py): the engine core
and worker in their own processes, as `LLM` runs them by default (masks on,
float32), on both runners (Model Runner V2 through Triton's interpreter, marked
`mrv2`).

A bad checkpoint (a path that does not exist, a truncated safetensors file, a wrong
shape) raises `WeightsRefusedError`, a `ValueError` naming `weights_path` and the
cause, without touching the weights; one that fails part-way
(`VLLM_SAMPLING_MASK_TEST_RELOAD_FAULT`) raises `WeightsRestoredError`. After each,
the seeded request generates exactly its reference (token ids, logprobs, masks); a
good reload changes it and reloading the demo model brings it back. In the release
tier (V1): every release's own reload path.
"""

from __future__ import annotations

import os

import pytest
from conftest import ENGINE_KWARGS, engine_on
from test_fix_reload_weights_recovery import BAD, FILE, PROMPT, SAMPLING

from vllm_sampling_mask import DEMO_MODEL
from vllm_sampling_mask.tools.demo import perturbed_draft
from vllm_sampling_mask.errors import WeightsRefusedError, WeightsRestoredError
from vllm_sampling_mask.patches.worker.fixes.reload_weights_recovery import FAULT

CASES = ("missing path", "truncated file", "wrong shape")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("checkpoints-llm"))
    made = {name: BAD[name][0](root) for name in CASES}
    made["fails in loading"] = perturbed_draft(os.path.join(root, "faulty"), noise=0.3)
    made["new weights"] = perturbed_draft(os.path.join(root, "new"), noise=0.3)
    return made


@pytest.fixture(scope="module", params=["v1", pytest.param("mrv2", marks=pytest.mark.mrv2)])
def llm(request, checkpoints):
    """One engine per runner (Model Runner V2 on a CPU host through Triton's
    interpreter), each running the tests below in order."""
    saved = os.environ.get(FAULT)
    os.environ[FAULT] = checkpoints["fails in loading"]     # the worker's environment
    try:
        engine = engine_on(request.param, **ENGINE_KWARGS)
    finally:
        if saved is None:
            os.environ.pop(FAULT, None)
        else:
            os.environ[FAULT] = saved
    yield engine
    del engine


def generate(llm) -> tuple:
    from vllm import SamplingParams

    llm.reset_prefix_cache()
    params = SamplingParams(**SAMPLING)
    out, = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)
    c, = out.outputs
    assert len(c.token_ids) == SAMPLING["max_tokens"]
    return (list(c.token_ids), [list(s) for s in c.sampling_mask.token_ids],
            [{t: lp.logprob for t, lp in row.items()} for row in c.logprobs])


def reload(llm, path):
    return llm.collective_rpc("reload_weights", kwargs={"weights_path": path})


@pytest.fixture(scope="module")
def reference(llm):
    return generate(llm)


@pytest.mark.parametrize("name", CASES)
def test_a_bad_checkpoint_raises_a_value_error_naming_it_and_nothing_changes(
        llm, reference, checkpoints, name):
    with pytest.raises(WeightsRefusedError) as refused:
        reload(llm, checkpoints[name])
    assert isinstance(refused.value, ValueError)
    message = str(refused.value)
    assert message.startswith(WeightsRefusedError.MARK) and BAD[name][1] in message
    assert "please check" not in message
    assert generate(llm) == reference


def test_a_failure_part_way_is_undone(llm, reference, checkpoints):
    with pytest.raises(WeightsRestoredError, match="fault injected by"):
        reload(llm, checkpoints["fails in loading"])
    assert generate(llm) == reference


def test_a_good_reload_changes_the_output_and_the_demo_model_brings_it_back(
        llm, reference, checkpoints):
    reload(llm, checkpoints["new weights"])
    assert generate(llm) != reference
    reload(llm, DEMO_MODEL)
    assert generate(llm) == reference
    assert os.path.isfile(os.path.join(DEMO_MODEL, FILE))
