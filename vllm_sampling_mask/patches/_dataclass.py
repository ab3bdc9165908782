"""Add a field to an upstream stdlib dataclass after it was defined.

Used for `EngineArgs.return_sampling_mask` and `CompletionOutput.sampling_mask`,
so that the new attribute is a real dataclass field: accepted by the
constructor, listed by `dataclasses.fields` (which `EngineArgs.from_cli_args`
reads), kept by `dataclasses.replace`. The class and the given subclasses are
re-processed by `dataclasses.dataclass`; the field goes last, with a default.
"""

from __future__ import annotations

import dataclasses

_GENERATED = ("__init__", "__repr__", "__eq__", "__match_args__")


def add_field(cls: type, name: str, annotation, default, subclasses=()) -> None:
    if name in {f.name for f in dataclasses.fields(cls)}:
        return
    cls.__annotations__ = {**cls.__dict__.get("__annotations__", {}), name: annotation}
    setattr(cls, name, dataclasses.field(default=default))
    for klass in (cls, *subclasses):
        p = klass.__dataclass_params__
        # Re-processing reads defaults from class attributes, which dataclasses
        # removed for default_factory fields: give every field its Field back.
        for f in klass.__dataclass_fields__.values():
            if f.name in klass.__dict__.get("__annotations__", {}):
                setattr(klass, f.name, f)
        for attr in _GENERATED:
            if _generated(klass.__dict__.get(attr)):
                delattr(klass, attr)
        dataclasses.dataclass(klass, init=p.init, repr=p.repr, eq=p.eq,
                              order=p.order, unsafe_hash=p.unsafe_hash,
                              frozen=p.frozen)


def _generated(member) -> bool:
    """True for what `dataclasses` wrote (code compiled from a string), not hand-written methods."""
    if isinstance(member, tuple):  # __match_args__
        return True
    code = getattr(getattr(member, "__wrapped__", member), "__code__", None)
    return code is not None and code.co_filename == "<string>"
