"""`worker.weights_check.compare`: a checkpoint whose tensors are not the served
model's is refused before any weight is loaded, with a sentence naming the first
offending tensor and the fix (the reload route turns it into a 400:
tests/server/test_weight_update_failures.py)."""

import pytest

from vllm_sampling_mask.errors import WeightsRefusedError
from vllm_sampling_mask.worker.weights_check import compare

SERVED = {"embed.weight": ("F32", (8, 4)), "head.weight": ("F32", (8, 4)),
          "norm.weight": ("F32", (4,))}


def _with(**changed):
    found = dict(SERVED)
    found.update({name.replace("__", "."): spec for name, spec in changed.items()})
    return found


def test_the_served_models_own_tensors_pass():
    compare(dict(SERVED), SERVED, "/ckpt")


@pytest.mark.parametrize("found, words", [
    ({n: s for n, s in SERVED.items() if n != "norm.weight"},
     ["lacks 1 tensor(s)", ": norm.weight.", "Save every weight"]),
    (_with(extra__weight=("F32", (1,))), ["1 tensor(s) the served model does not",
                                          ": extra.weight.", "another model's checkpoint"]),
    (_with(head__weight=("F32", (8, 5)), embed__weight=("F32", (9, 4))),
     ["2 tensor(s) another shape", "'embed.weight': [9, 4], served [8, 4]",
      "architecture"]),
    (_with(norm__weight=("BF16", (4,))),
     ["1 tensor(s) another dtype", "'norm.weight': BF16, served F32",
      "Save the weights in F32"]),
], ids=["missing", "extra", "shape", "dtype"])
def test_a_checkpoint_that_differs_is_refused_naming_the_tensor_and_the_fix(found, words):
    with pytest.raises(WeightsRefusedError) as refused:
        compare(found, SERVED, "/ckpt")
    message = str(refused.value)
    assert "'/ckpt'" in message
    for w in words:
        assert w in message
