"""A weight reload that fails loses nothing (`reload_weights_recovery`,
`collective_rpc_refusals`), through `POST /collective_rpc` `reload_weights` on a dev-mode
server of the demo model (the release's runner: V1 natively, Model Runner V2 where the
release has no V1 runner; masks on, float32).

Each bad checkpoint below is answered with one clear error naming the cause (HTTP
400 for the caller's checkpoint, no traceback in the body): a path that does not
exist (never tried as a hub repo id), a file instead of a directory, a truncated
safetensors file (its first half, as an unfinished write leaves it), a corrupt
header, a missing tensor, an extra tensor, a wrong shape, a wrong dtype, a
checkpoint of another architecture; a checkpoint that passes every check and fails
in loading (the `VLLM_SAMPLING_MASK_TEST_RELOAD_FAULT` hook: after half its tensors)
is answered 500 saying the previous weights are restored. After each, the same
seeded request generates exactly what it did before the first attempt (token ids,
logprobs, masks), `/weight_info` is unchanged, the server is healthy and not paused;
a request kept across a keep-mode pause around a failed reload finishes with the
tokens and masks it has without one. A good reload still changes the output (the
comparison can fail), and reloading the demo model brings the reference back.

The checks alone (no engine; `test_the_checks_*`) run in the release tier.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import requests
from conftest import free_port, host_env, server_runner

from vllm_sampling_mask import DEMO_MODEL
from vllm_sampling_mask.tools.demo import eagle_head, perturbed_draft, serving
from vllm_sampling_mask.errors import WeightsRefusedError
from vllm_sampling_mask.worker.weights_check import compare, manifest, refusal_in

PROMPT = [1, 412, 1290, 87, 2043, 615, 33, 1800]
SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 3, "max_tokens": 24,
            "ignore_eos": True, "logprobs": 1}
FILE = "model.safetensors"


def _copy(root, name: str) -> str:
    path = os.path.join(root, name)
    shutil.copytree(DEMO_MODEL, path)
    return path


def _rewrite(path: str, change) -> str:
    from safetensors.torch import load_file, save_file
    weights = load_file(os.path.join(path, FILE))
    change(weights)
    save_file(weights, os.path.join(path, FILE), metadata={"format": "pt"})
    return path


def _truncated(root) -> str:
    path = _copy(root, "truncated")
    with open(os.path.join(path, FILE), "rb") as f:
        data = f.read()
    with open(os.path.join(path, FILE), "wb") as f:
        f.write(data[:len(data) // 2])
    return path


def _corrupt_header(root) -> str:
    path = _copy(root, "corrupt-header")
    with open(os.path.join(path, FILE), "r+b") as f:
        f.seek(8)
        f.write(b"\xff\x00garbage{{{" * 3)
    return path


def _extra(weights):
    weights["model.layers.4.mlp.up_proj.weight"] = weights["model.layers.3.mlp.up_proj.weight"].clone()


def _wrong_shape(weights):
    weights["model.norm.weight"] = weights["model.norm.weight"][:64].clone()


def _wrong_dtype(weights):
    weights["model.norm.weight"] = weights["model.norm.weight"].half()


# name -> (how the checkpoint is made, what the refusal's message says)
BAD = {
    "missing path": (lambda root: os.path.join(root, "not-written-yet"), "does not exist"),
    "file, not a directory": (lambda root: os.path.join(_copy(root, "as-file"), FILE),
                              "is a file, not a directory"),
    "truncated file": (_truncated, "the file is truncated"),
    "corrupt header": (_corrupt_header, "is not valid JSON"),
    "missing tensor": (lambda root: _rewrite(_copy(root, "missing"),
                                             lambda w: w.pop("model.norm.weight")),
                       "lacks 1 tensor(s) the served model has: model.norm.weight"),
    "extra tensor": (lambda root: _rewrite(_copy(root, "extra"), _extra),
                     "has 1 tensor(s) the served model does not: "
                     "model.layers.4.mlp.up_proj.weight"),
    "wrong shape": (lambda root: _rewrite(_copy(root, "shape"), _wrong_shape),
                    "'model.norm.weight': [64], served [128]"),
    "wrong dtype": (lambda root: _rewrite(_copy(root, "dtype"), _wrong_dtype),
                    "'model.norm.weight': F16, served F32"),
    "another architecture": (lambda root: eagle_head(os.path.join(root, "eagle")),
                             "is a checkpoint of EagleLlamaForCausalLM"),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("checkpoints"))
    made = {name: make(root) for name, (make, _) in BAD.items()}
    made["fails in loading"] = perturbed_draft(os.path.join(root, "faulty"), noise=0.3)
    made["new weights"] = perturbed_draft(os.path.join(root, "new"), noise=0.3)
    return made


# -- the checks alone (release tier) ------------------------------------------------

@pytest.mark.release_tier
@pytest.mark.parametrize("name", sorted(BAD))
def test_the_checks_refuse_each_bad_checkpoint_by_its_cause(checkpoints, name):
    path, said = checkpoints[name], BAD[name][1]
    served = manifest(DEMO_MODEL)
    with pytest.raises(WeightsRefusedError) as refused:
        if name == "another architecture":
            from vllm_sampling_mask.worker.weights_check import architecture_problem
            architecture_problem(path, ["LlamaForCausalLM"])
        compare(manifest(path), served, path)
    message = str(refused.value)
    assert said in message and "\n" not in message
    assert message.startswith(WeightsRefusedError.MARK)


@pytest.mark.release_tier
def test_the_checks_pass_a_good_checkpoint(checkpoints):
    served = manifest(DEMO_MODEL)
    assert len(served) == 38 and served["model.norm.weight"] == ("F32", (128,))
    compare(manifest(checkpoints["new weights"]), served, checkpoints["new weights"])
    compare(manifest(checkpoints["fails in loading"]), served, "faulty")


@pytest.mark.release_tier
def test_the_checks_a_refusal_is_read_back_from_the_text_it_crosses_processes_as():
    refusal = str(WeightsRefusedError("'/x' lacks 1 tensor(s): 'a', b"))
    wrapped = ("Call to collective_rpc method failed: Worker failed with error "
               f"'{refusal}', please check the stack trace above for the root cause")
    assert refusal_in(wrapped) == refusal_in(refusal) == refusal
    assert refusal_in(f"Call to collective_rpc method failed: {refusal}\nTraceback") == \
        refusal
    assert refusal_in("Call to collective_rpc method failed: no such method") is None


# -- the server --------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(checkpoints, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-failed-reloads") / "vllm-serve.log"
    with serving(free_port(), str(log), runner=server_runner(),
                 env={"VLLM_SERVER_DEV_MODE": "1", **host_env(),
                      "VLLM_SAMPLING_MASK_TEST_RELOAD_FAULT":
                          checkpoints["fails in loading"]}) as base:
        r = requests.post(base + "/update_weight_version", json={"new_version": "v0"},
                          timeout=60)
        assert r.status_code == 200, r.text
        yield base


def generate(base: str, stream: bool = False) -> dict:
    """The seeded request's token ids, masks and logprobs (prefix cache reset first,
    so each run computes the whole prompt)."""
    assert requests.post(base + "/reset_prefix_cache", timeout=60).status_code == 200
    r = requests.post(base + "/inference/v1/generate", timeout=600,
                      json={"model": DEMO_MODEL, "token_ids": PROMPT,
                            "sampling_params": SAMPLING})
    assert r.status_code == 200, r.text[:300]
    choice, = r.json()["choices"]
    assert len(choice["token_ids"]) == SAMPLING["max_tokens"]
    return {k: choice[k] for k in ("token_ids", "sampling_mask", "logprobs")}


def reload(base: str, path: str) -> requests.Response:
    return requests.post(base + "/collective_rpc", timeout=600,
                         json={"method": "reload_weights", "kwargs": {"weights_path": path}})


@pytest.fixture(scope="module")
def reference(server):
    return generate(server)


def _serving_as_before(base: str, reference: dict) -> None:
    assert generate(base) == reference
    assert requests.get(base + "/weight_info", timeout=60).json() == {"weight_version": "v0"}
    assert requests.get(base + "/health", timeout=60).status_code == 200
    assert requests.get(base + "/is_paused", timeout=60).json() == {"is_paused": False}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_checkpoint_is_a_400_and_the_engine_serves_what_it_did(
        server, reference, checkpoints, name):
    r = reload(server, checkpoints[name])
    assert r.status_code == 400, r.text[:500]
    message = r.json()["error"]["message"]
    assert message.startswith(WeightsRefusedError.MARK) and BAD[name][1] in message, message
    assert "please check" not in message and r.json()["error"]["param"] == "weights_path"
    assert "Traceback" not in r.text and "File \"" not in r.text
    _serving_as_before(server, reference)


def test_a_failure_part_way_is_undone(server, reference, checkpoints):
    r = reload(server, checkpoints["fails in loading"])
    assert r.status_code == 500, r.text[:500]
    message = r.json()["error"]["message"]
    assert "previous weights are restored" in message
    assert "fault injected by VLLM_SAMPLING_MASK_TEST_RELOAD_FAULT" in message
    assert "Traceback" not in r.text
    _serving_as_before(server, reference)
    # and again: the layerwise state was left clean for the next reload
    assert reload(server, checkpoints["fails in loading"]).status_code == 500
    _serving_as_before(server, reference)


def test_a_request_kept_across_a_failed_reload_finishes_as_without_it(
        server, reference, checkpoints):
    def streamed() -> tuple[list, list]:
        body = {"model": DEMO_MODEL, "token_ids": PROMPT, "stream": True,
                "sampling_params": {**SAMPLING, "max_tokens": 96}}
        with requests.post(server + "/inference/v1/generate", json=body, stream=True,
                           timeout=600) as r:
            assert r.status_code == 200
            ids, masks = [], []
            for line in r.iter_lines(decode_unicode=True):
                if line.startswith("data: {"):
                    for choice in json.loads(line[len("data: "):])["choices"]:
                        ids += choice.get("token_ids") or []
                        masks += choice.get("sampling_mask") or []
                        if len(ids) >= 8 and not paused_once:
                            paused_once.append(pause_and_fail())
            return ids, masks

    def pause_and_fail() -> int:
        r = requests.post(server + "/pause", params={"mode": "keep", "clear_cache": "false"},
                          timeout=60)
        assert r.status_code == 200, r.text
        failed = reload(server, checkpoints["truncated file"]).status_code
        assert requests.post(server + "/resume", timeout=60).status_code == 200
        return failed

    paused_once = [True]        # the reference run: no pause
    assert requests.post(server + "/reset_prefix_cache", timeout=60).status_code == 200
    want = streamed()
    paused_once = []
    assert requests.post(server + "/reset_prefix_cache", timeout=60).status_code == 200
    got = streamed()
    assert paused_once == [400]
    assert len(got[0]) == 96 and got == want
    _serving_as_before(server, reference)


def test_a_good_reload_changes_the_output_and_the_demo_model_brings_it_back(
        server, reference, checkpoints):
    """What the comparisons above rest on: the output does follow the weights."""
    r = reload(server, checkpoints["new weights"])
    assert r.status_code == 200 and r.json() == {"results": [None]}, r.text
    assert generate(server) != reference
    assert reload(server, DEMO_MODEL).status_code == 200
    _serving_as_before(server, reference)
