"""The patch registry's records, and the order of wrappers stacked on one
upstream function: declared in the records (`after=`), applied in that order."""

from __future__ import annotations

import importlib
import os
import typing

import pytest

from vllm_sampling_mask import SUPPORTED_VLLM
from vllm_sampling_mask.patches import seams
from vllm_sampling_mask.patches import REGISTRY, Kind, Patch
from vllm_sampling_mask.patches._wrap import argument, with_argument, wraps, wraps_method
from vllm_sampling_mask.releases import RELEASES

pytestmark = pytest.mark.release_tier  # CI runs it on every release


def _closure(name: str, after_of=None) -> set[str]:
    """Every patch `name` is declared to wrap around, directly or not."""
    after_of = after_of or {n: r.after for n, r in REGISTRY.items()}
    seen: set[str] = set()
    todo = list(after_of[name])
    while todo:
        inner = todo.pop()
        if inner not in seen:
            seen.add(inner)
            todo.extend(after_of[inner])
    return seen


def undeclared_stacks(wraps: list, after_of: dict) -> list[str]:
    """For each upstream function wrapped by several patches (in the order the
    wrappers were applied: inner first), every pair whose outer patch does not
    declare the inner one in `after=`."""
    by_function: dict[str, list[str]] = {}
    for patch, function in wraps:
        by_function.setdefault(function, []).append(patch)
    problems = []
    for function, patches in by_function.items():
        for i, inner in enumerate(patches):
            for outer in patches[i + 1:]:
                if inner not in _closure(outer, after_of):
                    problems.append(f"{outer!r} wraps {function} over {inner!r} "
                                    f"without declaring after=({inner!r},)")
    return problems


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_each_record_names_its_module_kind_span_and_upstream(name):
    record = REGISTRY[name]
    assert isinstance(record, Patch) and record.name == name
    module = importlib.import_module(record.module)
    assert record.module == \
        f"vllm_sampling_mask.patches.{record.hop}.{record.kind.value}.{name}"
    assert callable(module.apply)
    header = module.__doc__ or ""
    assert "What" in header, f"{name}: header incomplete"
    # remove-when, the change and the seams are written once, in the record
    # (docs/patches.md's tables are written from it: tests/tools/test_patch_docs.py)
    assert "Remove when" not in header, f"{name}: remove-when belongs in its record"
    assert record.change.strip(), f"{name}: the record says what it changes (`change=`)"
    assert record.seams, f"{name}: no seams"
    assert all(isinstance(e, typing.get_args(seams.Entry)) for e in record.seams), name
    assert record.targets and all(isinstance(t, str) for t in record.targets)
    for bound in (record.since, record.until):   # a listed release, or open-ended
        assert bound is None or bound in SUPPORTED_VLLM, (name, bound)
    assert any(record.applies_to(r) for r in RELEASES), f"{name}: applies to no release"
    for release in RELEASES:                     # every `{role}` is a role of each release
        if record.applies_to(release):             # (Triton's, Starlette's: as they are)
            assert all(t.startswith(("vllm", "triton", "starlette"))
                       for t in record.targets_for(release))
    assert record.upstream.strip() and record.remove_when.strip()
    if record.kind is Kind.FIX:
        assert "#" in record.upstream or "would file" in record.upstream, (
            f"{name}: a fix names the upstream issue/PR or what would be filed")
    assert set(record.after) <= set(REGISTRY) and name not in _closure(name)


def test_seam_entries_are_written_in_the_records_only():
    """A patch's seam entries are in its record (`Patch.seams`); `patches.seams` holds
    the entry types and their logic, no entry of its own."""
    kinds = typing.get_args(seams.Entry)

    def holds_entry(value) -> bool:
        if isinstance(value, kinds):
            return True
        if isinstance(value, dict):
            value = list(value.values())
        return isinstance(value, (tuple, list)) and any(holds_entry(v) for v in value)

    assert not [name for name, value in vars(seams).items() if holds_entry(value)]


def test_every_hop_and_kind_is_a_folder_of_patches():
    # patches/<hop>/<kind>/<name>.py: where it acts, then what it is; nothing else
    root = os.path.dirname(importlib.import_module("vllm_sampling_mask.patches").__file__)
    found = {}
    for hop in os.listdir(root):
        if not os.path.isfile(os.path.join(root, hop, "__init__.py")):
            continue
        for kind in os.listdir(os.path.join(root, hop)):
            folder = os.path.join(root, hop, kind)
            if os.path.isfile(os.path.join(folder, "__init__.py")):
                found[hop, kind] = {f[:-3] for f in os.listdir(folder)
                                    if f.endswith(".py") and f != "__init__.py"}
    wanted = {}
    for name, record in REGISTRY.items():
        wanted.setdefault((record.hop, record.kind.value), set()).add(name)
    assert found == wanted
    assert {hop for hop, _ in found} <= {"common", "frontend", "http", "engine", "worker"}
    assert {kind for _, kind in found} <= {kind.value for kind in Kind}


def test_stacked_wrappers_have_a_declared_order_and_are_applied_in_it(stock_vllm):
    # which patch wraps which upstream function, in the order applied (conftest's
    # `_STOCK_PROBE`: a fresh interpreter, the import hooks off, `apply_all`)
    wraps_applied = stock_vllm["wraps"]
    assert all(patch in REGISTRY for patch, _ in wraps_applied), wraps_applied
    functions = [f for _, f in wraps_applied]
    assert len(set(functions)) < len(functions), "expected the known stacks"
    after_of = {n: r.after for n, r in REGISTRY.items()}
    assert undeclared_stacks(wraps_applied, after_of) == []


def test_an_undeclared_or_reversed_stack_is_caught():
    wraps = [["inner", "m:f"], ["outer", "m:f"], ["alone", "m:g"]]
    assert len(undeclared_stacks(wraps, {"inner": (), "outer": (), "alone": ()})) == 1
    assert undeclared_stacks(wraps, {"inner": (), "outer": ("inner",), "alone": ()}) == []
    # declared, but applied the other way round
    assert len(undeclared_stacks(wraps, {"inner": ("outer",), "outer": (), "alone": ()})) == 1


class _Upstream:
    def method(self, first, second=2, *, third=3):
        return first, second, third


def test_argument_reads_a_call_by_the_wrapped_signature():
    bound = _Upstream().method
    assert argument(bound, (1,), {}, "first") == 1
    assert argument(bound, (), {"first": 5}, "first") == 5
    assert argument(bound, (1,), {}, "second") == 2          # the default
    assert argument(bound, (1, 7), {}, "second") == 7
    assert argument(bound, (1,), {"third": 9}, "third") == 9
    with pytest.raises(TypeError, match="first"):
        argument(bound, (), {}, "first")
    args, kwargs = with_argument(bound, (1, 7), {}, "second", lambda v: v * 10)
    assert bound(*args, **kwargs) == (1, 70, 3)
    args, kwargs = with_argument(bound, (), {"first": 1, "second": 4}, "second", str)
    assert bound(*args, **kwargs) == (1, "4", 3)
    args, kwargs = with_argument(_Upstream.method, (None, 1), {}, "first", lambda v: -v)
    assert _Upstream.method(*args, **kwargs) == (-1, 2, 3)


def test_a_per_token_method_has_one_plain_wrapper():
    """`wraps_method` calls its wrapper as `wraps` does, keeps the original as
    `__wrapped__`, and stacks with no other wrapper, either way round."""
    class Upstream:
        def method(self, first, second=2):
            return first, second

        @classmethod
        def made(cls):
            return cls

    module = type("module", (), {"Upstream": Upstream})
    original, seen = Upstream.method, []

    @wraps_method(module, "Upstream.method")
    def method(wrapped, instance, args, kwargs):
        seen.append((instance, argument(wrapped, args, kwargs, "second")))
        return wrapped(*args, **kwargs)[::-1]

    one = Upstream()
    assert one.method(1, second=5) == (5, 1) and seen == [(one, 5)]
    assert Upstream.method.__wrapped__ is original
    assert Upstream.method.__name__ == "method"
    for refused in ("Upstream.method", "Upstream.made"):   # wrapped, or not a plain method
        with pytest.raises(TypeError, match="use wraps"):
            wraps_method(module, refused)
    with pytest.raises(TypeError, match="stacks with nothing"):
        wraps(module, "Upstream.method")(method)


# The seams the runners' adapters to `SamplingMaskState` rely on (beside
# tests/patches/test_seams.py's tables): where each runner's per-step order is assumed.
def _original(fn):
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def test_v1_batch_update_is_complete_when_may_reorder_batch_returns():
    import inspect

    from conftest import skip_without_v1_runner
    skip_without_v1_runner()

    from vllm.v1.sample.logits_processor.interface import MoveDirectionality
    from vllm.v1.sample.logits_processor.state import BatchUpdateBuilder
    from vllm.v1.worker import gpu_model_runner

    from vllm_sampling_mask.patches import apply as patching
    patching.apply_all()
    source = inspect.getsource(_original(gpu_model_runner.GPUModelRunner._update_states))
    reorder = source.index("self._may_reorder_batch(scheduler_output)")
    refresh = source.index("self.input_batch.refresh_metadata()")
    between = [line.strip() for line in source[reorder:refresh].splitlines()[1:]]
    assert reorder < refresh and all(not line or line.startswith("#") for line in between), (
        "seam 'runner_v1' moved: _update_states changes the batch between "
        "_may_reorder_batch and refresh_metadata")
    assert source.count("input_batch.add_request(") == 1
    assert source.index("input_batch.add_request(") < reorder
    builder = BatchUpdateBuilder()
    assert (builder.added, builder.removed, builder.moved) == ([], [], [])
    assert {d.name for d in MoveDirectionality} == {"SWAP", "UNIDIRECTIONAL"}
    params = list(inspect.signature(
        _original(gpu_model_runner.GPUModelRunner._may_reorder_batch)).parameters)
    assert params == ["self", "scheduler_output"]


def test_mrv2_samples_before_it_builds_the_async_output():
    import inspect

    from vllm.v1.worker.gpu import model_runner

    from vllm_sampling_mask.patches import apply as patching
    patching.apply_all()
    runner = model_runner.GPUModelRunner
    source = inspect.getsource(_original(runner.sample_tokens))
    assert source.index("= self.sample(") < source.index("AsyncOutput(")
    assert "main_stream=self.main_stream" in source
    assert "copy_stream=self.output_copy_stream" in source
    sample = inspect.getsource(_original(runner.sample))
    assert "return sampler_output, sampler_output.num_sampled" in sample
    remove = inspect.getsource(_original(runner._remove_request))
    assert "req_idx = self.req_states.remove_request(req_id)" in remove
    assert list(inspect.signature(_original(runner._remove_request)).parameters) == [
        "self", "req_id"]
