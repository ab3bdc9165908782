"""The checks a weight reload runs on a checkpoint before it touches the engine's
weights, and the wording of its refusals.

Plain code, no vLLM (nor torch) import: `patches/worker/fixes/reload_weights_recovery.py`
calls it in the worker, `patches/frontend/fixes/collective_rpc_refusals.py` reads its refusals back in
the API server.

- `manifest(path)`: the tensors of a checkpoint directory, `{name: (dtype, shape)}`,
  read from its safetensors headers only: the path exists, is a local directory
  (never a Hugging Face repo id), its `.safetensors` files are readable, each header
  parses, and each file holds exactly the bytes its header declares (a file cut
  short, as a trainer's unfinished write leaves it, is caught here);
- `compare(found, expected)`: the names, shapes and dtypes of a checkpoint against
  those of the one the engine serves;
- `architecture_problem(path, served)`: the checkpoint's `config.json` names another
  architecture.

Each problem raises `errors.WeightsRefusedError`, one line naming `weights_path`, the
cause and the fix; `refusal_in(text)` finds such a line in an error that crossed a
process boundary as text.
"""

from __future__ import annotations

import json
import math
import os
import struct

from vllm_sampling_mask.errors import WeightsRefusedError, WeightsRestoredError

__all__ = ["manifest", "compare", "architecture_problem", "reload_arguments", "refusal_in",
           "refused_parameter", "failure_in", "DTYPE_BYTES"]

# safetensors' dtype names -> bytes an element
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
               "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
               "I64": 8, "U64": 8, "F64": 8, "C64": 8}
# a header larger than this is no header (safetensors' own limit is 100 MB)
MAX_HEADER = 100_000_000
SHOWN = 3     # names a refusal lists before "and N more"

Manifest = dict[str, tuple[str, tuple[int, ...]]]


def _refuse(reason: str) -> WeightsRefusedError:
    return WeightsRefusedError(reason)


def _listing(names) -> str:
    names = sorted(names)
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def weight_files(path: str) -> list[str]:
    """The `.safetensors` files of checkpoint directory `path` (those its index names,
    when it has one); refuses a path that is no readable local directory."""
    if not isinstance(path, str) or not path:
        raise _refuse(f"expected the path of a local checkpoint directory, got {path!r}")
    if not os.path.exists(path):
        raise _refuse(f"{path!r} does not exist on the server's filesystem (a reload "
                      "reads a local directory, never a Hugging Face repo id): write "
                      "the checkpoint there first, or pass the directory it is in")
    if not os.path.isdir(path):
        raise _refuse(f"{path!r} is a file, not a directory: pass the checkpoint "
                      "directory that holds it")
    try:
        entries = sorted(os.listdir(path))
    except OSError as e:
        raise _refuse(f"{path!r} cannot be read ({e.strerror})") from None
    files = [e for e in entries if e.endswith(".safetensors")]
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index) as f:
                listed = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise _refuse(f"model.safetensors.index.json in {path!r} does not parse "
                          f"({type(e).__name__}): rewrite it, or remove it") from None
        missing = [name for name in listed if name not in files]
        if missing:
            raise _refuse(f"{path!r} lacks {_listing(missing)}, which its "
                          "model.safetensors.index.json names: finish writing the "
                          "checkpoint before reloading")
        files = listed
    if not files:
        raise _refuse(f"{path!r} holds no .safetensors file: save the weights with "
                      "safetensors (save_pretrained's default)")
    return [os.path.join(path, name) for name in files]


def read_header(file: str) -> Manifest:
    """The tensors of one safetensors file, checked against its length."""
    name = os.path.basename(file)
    try:
        with open(file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise _refuse(f"{name} is {size} bytes long, too short for a "
                              "safetensors header: the file is truncated; write it again")
            (length,) = struct.unpack("<Q", head)
            if length > min(MAX_HEADER, size - 8):
                raise _refuse(f"{name}'s header length ({length} bytes) runs past the "
                              f"end of the file ({size} bytes): the file is truncated or "
                              "not safetensors; write it again")
            header = json.loads(f.read(length))
    except OSError as e:
        raise _refuse(f"{name} cannot be read ({e.strerror})") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise _refuse(f"{name}'s header is not valid JSON ({type(e).__name__}): the "
                      "file is corrupt; write it again") from None
    if not isinstance(header, dict):
        raise _refuse(f"{name}'s header is not a JSON object: the file is corrupt")
    data = size - 8 - length
    found: Manifest = {}
    spans = []
    for tensor, entry in header.items():
        if tensor == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            shape = tuple(int(d) for d in shape)
            begin, end = int(begin), int(end)
        except (TypeError, KeyError, ValueError):
            raise _refuse(f"{name}'s header entry for {tensor!r} lacks a dtype, shape "
                          "or data_offsets: the file is corrupt") from None
        if dtype not in DTYPE_BYTES or any(d < 0 for d in shape):
            raise _refuse(f"{name}'s header gives {tensor!r} the dtype {dtype!r} and "
                          f"shape {list(shape)}, which safetensors does not have")
        if end - begin != math.prod(shape) * DTYPE_BYTES[dtype] or begin < 0:
            raise _refuse(f"{name}'s header gives {tensor!r} {end - begin} bytes for a "
                          f"{dtype} tensor of shape {list(shape)}: the file is corrupt")
        found[tensor] = (dtype, shape)
        spans.append((begin, end))
    spans.sort()
    at = 0
    for begin, end in spans:
        if begin != at:
            raise _refuse(f"{name}'s tensors overlap or leave gaps in its data: the "
                          "file is corrupt; write it again")
        at = end
    if at != data:
        what = "truncated" if at > data else "longer than its header says"
        raise _refuse(f"{name} holds {data} bytes of tensor data, its header declares "
                      f"{at}: the file is {what} (a write not finished?); write it "
                      "again and reload")
    return found


def manifest(path: str) -> Manifest:
    """Every tensor of checkpoint directory `path`, from its headers (checked)."""
    found: Manifest = {}
    for file in weight_files(path):
        for tensor, spec in read_header(file).items():
            if tensor in found:
                raise _refuse(f"{tensor!r} is in two files of {path!r}: remove the "
                              "stale one")
            found[tensor] = spec
    return found


def compare(found: Manifest, expected: Manifest, path: str) -> None:
    """Refuses a checkpoint whose tensors are not those the engine serves (by name,
    shape and dtype)."""
    missing = expected.keys() - found.keys()
    if missing:
        raise _refuse(f"{path!r} lacks {len(missing)} tensor(s) the served model has: "
                      f"{_listing(missing)}. Save every weight of the model (a "
                      "partial checkpoint is not reloaded)")
    extra = found.keys() - expected.keys()
    if extra:
        raise _refuse(f"{path!r} has {len(extra)} tensor(s) the served model does not: "
                      f"{_listing(extra)}. Save the served model's weights under their "
                      "own names (is it another model's checkpoint?)")
    count, n = _differing(found, expected, _SHAPE)
    if count:
        raise _refuse(f"{path!r} gives {count} tensor(s) another shape than the served "
                      f"model's, e.g. {n!r}: {list(found[n][_SHAPE])}, served "
                      f"{list(expected[n][_SHAPE])}. Save the served model's architecture")
    count, n = _differing(found, expected, _DTYPE)
    if count:
        want = expected[n][_DTYPE]
        raise _refuse(f"{path!r} gives {count} tensor(s) another dtype than the served "
                      f"checkpoint's, e.g. {n!r}: {found[n][_DTYPE]}, served {want}. Save "
                      f"the weights in {want}")


_DTYPE, _SHAPE = 0, 1   # a manifest's (dtype, shape) per tensor


def _differing(found: Manifest, expected: Manifest, field: int) -> tuple[int, str | None]:
    """How many tensors of `found` differ from `expected` in `field`, and the first
    of them by name (None when none does)."""
    differ = sorted(n for n in found if found[n][field] != expected[n][field])
    return len(differ), (differ[0] if differ else None)


def architecture_problem(path: str, served: list[str] | None) -> None:
    """Refuses a checkpoint whose `config.json` names other architectures than
    `served` (nothing to compare without either)."""
    config = os.path.join(path, "config.json")
    if not served or not os.path.isfile(config):
        return
    try:
        with open(config) as f:
            theirs = json.load(f).get("architectures")
    except (OSError, ValueError, AttributeError):
        raise _refuse(f"config.json in {path!r} does not parse: rewrite it, or "
                      "remove it") from None
    if theirs and list(theirs) != list(served):
        raise _refuse(f"{path!r} is a checkpoint of {', '.join(map(str, theirs))}; the "
                      f"engine serves {', '.join(served)}. A reload takes new weights "
                      "of the served model only (start a server for the other model)")


RELOAD_PARAMETERS = ("weights_iterator", "weights_path", "is_checkpoint_format")


def reload_arguments(args: tuple, kwargs: dict) -> dict:
    """`reload_weights`' arguments by name (`RELOAD_PARAMETERS`, the runner's), refused
    when they do not fit: too many, an unknown or repeated name, a wrong type."""
    if len(args) > len(RELOAD_PARAMETERS):
        raise WeightsRefusedError(f"takes at most {len(RELOAD_PARAMETERS)} arguments "
                                  f"({', '.join(RELOAD_PARAMETERS)}), got {len(args)}",
                                  parameter="args")
    named = dict(zip(RELOAD_PARAMETERS, args))
    for name, value in kwargs.items():
        if name not in RELOAD_PARAMETERS:
            raise WeightsRefusedError(f"unknown argument {name!r}: it takes "
                                      f"{', '.join(RELOAD_PARAMETERS)}", parameter="kwargs")
        if name in named:
            raise WeightsRefusedError(f"{name} given twice (by position and by name)",
                                      parameter=name)
        named[name] = value
    iterator = named.get("weights_iterator")
    if iterator is not None and (isinstance(iterator, (str, bytes, dict)) or
                                 not hasattr(iterator, "__iter__")):
        raise WeightsRefusedError("expected an iterable of (name, tensor) pairs, got "
                                  f"{type(iterator).__name__}: over HTTP pass "
                                  "weights_path instead", parameter="weights_iterator")
    flag = named.get("is_checkpoint_format", True)
    if not isinstance(flag, bool):
        raise WeightsRefusedError(f"expected true or false, got {flag!r}",
                                  parameter="is_checkpoint_format")
    return named


def _line_after(text: str, mark: str) -> str | None:
    """From `mark` to the end of its line; where the error was quoted by a wrapper
    (the executor's "Worker failed with error '...', please check ..."), to the
    closing quote."""
    at = text.find(mark)
    if at < 0:
        return None
    line = text[at:].split("\n", 1)[0]
    if text[:at].endswith("'") and "'" in line:
        line = line[:line.rindex("'")]
    return line.strip()


def refusal_in(text: str) -> str | None:
    """The refusal's own line in an error message that crossed processes as text
    (the worker's, wrapped by the executor and the engine core), or None."""
    return _line_after(text, WeightsRefusedError.PREFIX)


def refused_parameter(line: str) -> str:
    """The parameter a refusal's line names (`refusal_in`)."""
    return line[len(WeightsRefusedError.PREFIX):].split(")", 1)[0]


def failure_in(text: str) -> str | None:
    """The line of a reload that failed part-way and was undone, or None."""
    return _line_after(text, WeightsRestoredError.MARK)
