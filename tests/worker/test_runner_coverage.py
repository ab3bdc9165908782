"""An engine asked for masks refuses to start on a model runner that no adapter
extracts masks from (`runner_coverage`), naming the runner: through the real
`Worker.load_model` of the installed release, with its real runner classes. On
vLLM 0.34 the uncovered runner is upstream's own `StandaloneCPUModelRunner` (a CPU
host without Triton); on the other releases every runner vLLM can pick is covered,
so a class of the test's own stands for a future one."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

from vllm_sampling_mask.worker.coverage import covered, refuse_uncovered

pytestmark = pytest.mark.release_tier


class FutureRunner:
    """A model runner vLLM might add, wrapped by no adapter."""


def _uncovered_runner_classes():
    classes = [FutureRunner]
    try:
        module = importlib.import_module("vllm.v1.worker.cpu.standalone_model_runner")
    except ImportError:   # before 0.34
        return classes
    return [module.StandaloneCPUModelRunner, *classes]


def _worker(runner_class, mask: bool):
    """The release's real GPU/CPU `Worker` (CPUWorker inherits `load_model`), with
    the runner `init_device` would have built, before its model is loaded. Its
    `vllm_config` is a stand-in holding the one field the check reads
    (`model_config.sampling_mask_settings`)."""
    from vllm.v1.worker.gpu_worker import Worker
    worker = Worker.__new__(Worker)
    settings = object() if mask else None   # `ModelConfig.sampling_mask_settings`
    worker.vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(sampling_mask_settings=settings))
    worker.model_runner = runner_class.__new__(runner_class)
    return worker


@pytest.mark.parametrize("runner_class", _uncovered_runner_classes(),
                         ids=lambda c: c.__name__)
def test_the_flag_on_an_uncovered_runner_is_refused_naming_it(runner_class):
    worker = _worker(runner_class, mask=True)
    with pytest.raises(ValueError) as refused:
        worker.load_model()
    message = str(refused.value)
    assert runner_class.__qualname__ in message and "--return-sampling-mask" in message
    assert "without --return-sampling-mask" in message   # what to do


@pytest.mark.parametrize("runner_class", _uncovered_runner_classes(),
                         ids=lambda c: c.__name__)
def test_without_the_flag_the_runner_loads_as_upstream_does(runner_class):
    """No check: upstream's own `load_model` runs (and fails on this test's worker,
    which has no device: an AttributeError, not the refusal)."""
    worker = _worker(runner_class, mask=False)
    with pytest.raises(AttributeError) as raised:
        worker.load_model()
    assert "--return-sampling-mask" not in str(raised.value)


def test_the_runners_the_release_picks_are_covered():
    """Model Runner V2 (the CPU one subclasses it) and, where the release has it, the
    V1 runner pass the check."""
    from conftest import v1_runner
    from vllm.v1.worker.cpu.model_runner import CPUModelRunner as CPUModelRunnerV2
    runners = [CPUModelRunnerV2]
    if v1_runner():
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
        runners.append(CPUModelRunner)
    for runner_class in runners:
        runner = runner_class.__new__(runner_class)
        assert covered(runner), runner_class
        refuse_uncovered(runner)
