"""A weight reload that fails leaves the engine serving the weights it had.

What it wraps: `Worker.reload_weights` (vllm/v1/worker/gpu_worker.py; the CPU worker
inherits it; `collective_rpc("reload_weights", ...)` from the HTTP route, `LLM` and
`AsyncLLM` reaches it), around `cpu_reload_tied_lm_head`:

- refuses bad arguments and a checkpoint that does not match the served one
  (`WeightsRefusedError`, HTTP 400), nothing loaded;
- snapshots the model, runs the reload, and on any exception puts the snapshot back
  (`WeightsRestoredError` naming the cause).

Why: a reload that fails part-way leaves layers on the meta device and the next forward
pass kills the engine.
"""

from __future__ import annotations

import contextlib
import itertools
import os

from vllm_sampling_mask.errors import WeightsRefusedError, WeightsRestoredError
from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.weights_check import (architecture_problem, compare, manifest,
                                              reload_arguments)

FAULT = "VLLM_SAMPLING_MASK_TEST_RELOAD_FAULT"
_SERVED = "_sampling_mask_served_manifest"   # the worker's: the served checkpoint's tensors


def served_manifest(worker, model_config):
    """The tensors of the checkpoint the engine serves: remembered from its last
    reload, else read from the directory it loaded (None: not a local directory, or
    no longer readable, and nothing is compared)."""
    found = getattr(worker, _SERVED, None)
    if found is None and isinstance(model_config.model, str) and \
            os.path.isdir(model_config.model):
        with contextlib.suppress(WeightsRefusedError):
            found = manifest(model_config.model)
    return found


def check(worker, path) -> dict:
    """Refuses `path` before the weights are touched (`WeightsRefusedError`)."""
    config = worker.vllm_config.model_config
    found = manifest(path)
    architecture_problem(path, getattr(config.hf_config, "architectures", None))
    expected = served_manifest(worker, config)
    if expected is not None:
        compare(found, expected, path)
    return found


class Snapshot:
    """What a reload changes in the worker's model, taken before it starts."""

    # Every module's attributes and parameter / buffer / submodule tables (so the CPU
    # GEMMs packed from the old weights, `layer.cpu_linear`, are kept), a host copy of
    # every parameter and buffer, and the model config's fields (upstream points
    # `model_config.model` at the new path before it loads).
    def __init__(self, model, model_config) -> None:
        self.modules = [(m, dict(vars(m)), dict(m._parameters), dict(m._buffers),
                         dict(m._modules), set(m._non_persistent_buffers_set))
                        for m in model.modules()]
        self.values = [(t, t.detach().to("cpu", copy=True))
                       for t in itertools.chain(model.parameters(), model.buffers())]
        self.model = model
        self.config = (model_config, dict(vars(model_config)))

    @property
    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for _, v in self.values)

    def restore(self) -> None:
        import torch

        for module, attrs, params, buffers, children, non_persistent in self.modules:
            current = vars(module)
            for name in [n for n in current if n not in attrs]:
                del current[name]
            current.update(attrs)
            for table, saved in ((module._parameters, params), (module._buffers, buffers),
                                 (module._modules, children)):
                table.clear()
                table.update(saved)
            module._non_persistent_buffers_set.clear()
            module._non_persistent_buffers_set.update(non_persistent)
        with torch.no_grad():
            for tensor, value in self.values:
                if tensor.shape == value.shape and tensor.dtype == value.dtype:
                    tensor.data.copy_(value)
                else:
                    tensor.data = value.to(tensor.device)
        _reset_layerwise_state(self.model)
        config, fields = self.config
        vars(config).update(fields)


def _reset_layerwise_state(model) -> None:
    """Upstream's layerwise reload keeps per-layer state between its start and its
    finish; a layer whose state was left mid-load would be skipped by the next
    reload's start."""
    try:
        from vllm.model_executor.model_loader.reload import layerwise
    except ImportError:
        return
    for module in model.modules():
        info = layerwise.LAYERWISE_INFO.get(module)
        if info is not None:
            info.reset()
    with contextlib.suppress(AttributeError):
        layerwise.LOADING_LAYERS.clear()


@contextlib.contextmanager
def injected_fault(model, path):
    """The test hook (`FAULT`): a reload from that directory fails after half its
    tensors reached the model's `load_weights`."""
    target = os.environ.get(FAULT)
    if not target or path is None or os.path.realpath(path) != os.path.realpath(target):
        yield
        return
    half = max(1, len(manifest(path)) // 2)
    had = "load_weights" in vars(model)
    original = model.load_weights

    def load_weights(weights, *args, **kwargs):
        def cut(weights):
            for i, item in enumerate(weights):
                if i == half:
                    raise RuntimeError(f"fault injected by {FAULT} after {half} tensors")
                yield item
        return original(cut(weights), *args, **kwargs)

    model.load_weights = load_weights
    try:
        yield
    finally:
        if had:
            model.load_weights = original
        else:
            vars(model).pop("load_weights", None)


def apply(module, release: Release) -> None:
    # Upstream's layerwise reload moves every layer to the meta device, then loads it
    # back tensor by tensor: an exception part-way (a truncated file) leaves layers there
    # ("attempted to run this operator with Meta tensors" on the next step); a path that
    # does not exist was taken for a hub repo id and retried before a 500.
    @wraps(module, "Worker.reload_weights")
    def reload_weights(wrapped, self, args, kwargs):
        # arguments that do not fit the runner's (weights_iterator, weights_path,
        # is_checkpoint_format) are refused; a `weights_path` (no iterator) is checked
        # before anything is touched (`weights_check`: a local directory, headers that
        # parse and bytes that are there, config.json's architecture, the tensors'
        # names, shapes and dtypes those of the served checkpoint)
        named = reload_arguments(args, kwargs)
        path = named.get("weights_path")
        from_disk = named.get("weights_iterator") is None
        config = self.vllm_config.model_config
        found = check(self, path) if path is not None and from_disk else None
        model = self.model_runner.get_model()
        saved = Snapshot(model, config)
        try:
            with injected_fault(model, path):
                result = wrapped(*args, **kwargs)
        except Exception as exc:
            saved.restore()
            raise WeightsRestoredError(exc) from exc
        if found is not None:   # the next reload compares with this one
            setattr(self, _SERVED, found)

        return result
