"""Request errors said as one sentence a person can read.

Plain module (no vLLM import): turns the errors pydantic / FastAPI report for a
request body (`RequestValidationError.errors()`: dicts with `type`, `loc`, `msg`,
`input`, `ctx`) into `(param, message)`: the parameter's name as the client
spelled it (`return_sampling_mask`, `sampling_params.top_k`, `messages[0].content`,
`body` for the body as a whole) and what is allowed, e.g.

    return_sampling_mask must be true, false or null, not 'yes'.

The `validation_messages` patch uses it for the HTTP routes' 400s;
`refusal_line` is the one log line a refused request leaves; `misplaced_field`
finds a mask field misspelled by a near miss or put where the route does not read
it (and, on `/inference/v1/generate`, a sampling parameter outside
`sampling_params`), which the routes would otherwise silently ignore.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Collection

# Location segments pydantic adds that are no field a client wrote: validator
# wrappers (`function-wrap[...]`), union branches (`str`, `list[int]`,
# `is-instance[SamplingParams]`, a class name such as
# `ChatCompletionUserMessageParam`) and the like. Client fields are snake_case.
_MARKER = re.compile(r"^[A-Za-z_\-]+\[.*\]$|^[A-Z]\w*$|^(str|int|float|bool|list|dict|none|"
                     r"bytes|typed-dict|constrained-int|constrained-str|nullable|default)$")


def _marker(segment) -> bool:
    return isinstance(segment, str) and bool(_MARKER.match(segment))


# What a value of a type is called in "must be ..."
_KINDS = {
    "bool_type": "true or false", "bool_parsing": "true or false",
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
    "string_type": "a string", "string_unicode": "a string", "bytes_type": "a string",
    "list_type": "a list", "tuple_type": "a list", "set_type": "a list",
    "iterable_type": "a list",
    "dict_type": "a JSON object", "model_type": "a JSON object",
    "model_attributes_type": "a JSON object", "dataclass_type": "a JSON object",
    "none_required": "null",
}
_BRANCH_KINDS = {"str": "a string", "int": "an integer", "float": "a number",
                 "bool": "true or false", "list": "a list", "dict": "a JSON object"}


def show(value) -> str:
    """A value as the client sent it: strings quoted, JSON for the rest, short."""
    if isinstance(value, str):
        text = repr(value)
    elif value is None or isinstance(value, (bool, int, float, list, dict)):
        try:
            text = json.dumps(value, allow_nan=True)
        except (TypeError, ValueError):
            text = repr(value)
    else:
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def param_of(loc) -> str:
    """`('body', 'sampling_params', 'top_k')` -> `sampling_params.top_k`; the body
    itself -> `body`."""
    parts = [p for p in loc if not _marker(p)]
    if parts and parts[0] == "body":
        parts = parts[1:]
    text = ""
    for p in parts:
        if isinstance(p, int):
            text += f"[{p}]"
        elif not str(p).isidentifier() and text:    # a dict key: logit_bias["7"]
            text += f"[{json.dumps(str(p))}]"
        else:
            text += f".{p}" if text else str(p)
    return text or "body"


def _or(options) -> str:
    options = list(dict.fromkeys(options))
    return options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]


def sentence(error: dict, nullable: bool | None = None) -> tuple[str, str]:
    """(param, message) for one pydantic error. `nullable`: whether the field also
    takes null (None: unknown, not said)."""
    kind = error.get("type", "")
    loc = tuple(error.get("loc") or ())
    ctx = error.get("ctx") or {}
    msg = str(error.get("msg", "")).rstrip(".")
    value = error.get("input")
    param = param_of(loc)
    got = f", not {show(value)}" if "input" in error else ""

    if kind == "json_invalid":
        where = next((p for p in loc[1:] if isinstance(p, int)), None)
        at = f", character {where}" if where is not None else ""
        reason = ctx.get("error") or "invalid JSON"
        return "body", (f"The request body is not valid JSON ({reason}{at}): send one "
                        "JSON object.")
    if kind == "missing":
        if param == "body":
            return "body", "The request has no body: send one JSON object."
        return param, f"{param} is required: add it to the request."
    if kind == "extra_forbidden":
        return param, f"{param} is not a parameter of this route: remove it."
    if kind in ("value_error", "assertion_error"):
        cause = ctx.get("error")
        named = getattr(cause, "parameter", None)
        text = str(cause) if cause is not None else re.sub(r"^(Value|Assertion) error, ",
                                                           "", msg)
        text = text.strip()
        if param == "body" and named:
            param = named
        elif (not named and param.split(".")[-1] == "sampling_params"
              and (field := param_in_message(text))):
            # upstream's own refusal of one of its values, raised while pydantic
            # built the object ("top_k must be ...": a plain ValueError on 0.24)
            param = f"{param}.{field}"
        if param != "body" and not text.startswith(param.split(".")[-1]):
            text = f"{param}: {text}"
        return param, text if text.endswith((".", "?", "!", ")")) else text + "."
    if kind in _KINDS:
        allowed = _KINDS[kind]
        if nullable and kind in ("bool_type", "bool_parsing"):
            allowed = "true, false or null"
        elif nullable:
            allowed += " or null"
        if param == "body":
            return "body", f"The request body must be {allowed}{got}."
        return param, f"{param} must be {allowed}{got}."
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
              "less_than_equal": "<="}
    if kind in bounds:
        limit = next(iter(ctx.values()), "?")
        return param, f"{param} must be {bounds[kind]} {limit}{got}."
    if kind in ("literal_error", "enum"):
        return param, f"{param} must be {ctx.get('expected', 'one of the listed values')}{got}."
    if kind in ("too_short", "too_long"):
        n = ctx.get("min_length" if kind == "too_short" else "max_length", "?")
        most = "at least" if kind == "too_short" else "at most"
        return param, f"{param} must hold {most} {n} item{'s' if n != 1 else ''}{got}."
    if kind in ("string_too_short", "string_too_long"):
        n = ctx.get("min_length" if kind == "string_too_short" else "max_length", "?")
        most = "at least" if kind == "string_too_short" else "at most"
        return param, f"{param} must have {most} {n} character{'s' if n != 1 else ''}{got}."
    return param, f"{param}: {msg[:1].lower() + msg[1:]}{got}."


def describe(errors: list[dict], nullable: Callable[[tuple], bool | None] | None = None
             ) -> tuple[str, str]:
    """(param, message) for everything wrong with a request body.

    The branches of a union that cannot be what the client meant (a wrong
    `role` literal, a Python-only `is-instance` branch) are dropped; errors left
    on one field from several branches become one sentence listing the forms it
    takes (`prompt must be a string or a list of token ids, not 5.`). At most
    three fields are described."""
    nullable = nullable or (lambda loc: None)
    errors = _prune([e for e in errors if isinstance(e, dict)])
    unions: dict[str, list[dict]] = {}
    for error in errors:
        unions.setdefault(_union_key(error.get("loc") or ()), []).append(error)
    sentences = []
    for key, group in unions.items():
        branches = {_branch(e.get("loc") or ()) for e in group}
        if len(branches) > 1 and None not in branches and all(
                _TYPE_BRANCH.match(b) for b in branches) and not any(
                e.get("type") in ("json_invalid", "missing") for e in group):
            sentences.append(_branches_sentence(key, group, nullable))
            continue
        by_field: dict[str, list[dict]] = {}
        for error in group:
            by_field.setdefault(param_of(error.get("loc") or ()), []).append(error)
        for param, same in by_field.items():
            kinds = {e.get("type") for e in same}
            if len(same) > 1 and len(kinds) > 1 and kinds <= set(_KINDS):
                sentences.append(_union_sentence(param, same, nullable))
            elif len(same) > 1 and kinds == {"literal_error"}:
                expected = [(e.get("ctx") or {}).get("expected", "") for e in same]
                merged = {**same[0], "ctx": {"expected": _or(
                    [x for text in expected for x in re.split(r", | or ", text) if x])}}
                sentences.append(sentence(merged))
            else:
                e = same[0]
                sentences.append(sentence(e, nullable(_fields(e.get("loc") or ()))))
    if not sentences:
        return "body", "The request was refused: check its JSON body."
    text = " ".join(m[:1].upper() + m[1:] if m.startswith("the ") else m
                    for _, m in sentences[:3])
    if len(sentences) > 3:
        text += f" ({len(sentences) - 3} more problem{'s' if len(sentences) > 4 else ''}.)"
    return sentences[0][0], text


# A union branch named by a type (`str`, `list[int]`), not by a class
_TYPE_BRANCH = re.compile(r"^(str|int|float|bool|list|dict|none|list\[.*\]|dict\[.*\])$")


def _fields(loc) -> tuple:
    """A location without pydantic's markers: the fields and indices a client wrote."""
    return tuple(p for p in loc if not _marker(p))


def _union_key(loc) -> str:
    """The location up to its first union-branch marker, as a parameter name."""
    head = []
    for p in loc:
        if _marker(p) and not str(p).startswith("function-"):
            break
        head.append(p)
    return param_of(tuple(head))


def _branch(loc) -> str | None:
    for p in loc:
        if _marker(p) and not str(p).startswith("function-"):
            return p
    return None


def _branches_sentence(param: str, group: list[dict], nullable) -> tuple[str, str]:
    """`stop must be a string, a list of strings or null, not [5].`: the forms a
    union field takes, named by its branches."""
    forms, value, have_value = [], None, False
    for e in group:
        loc = tuple(e.get("loc") or ())
        branch = _branch(loc)
        forms.append(_FORMS.get(branch) or _BRANCH_KINDS.get(branch) or branch)
        if not have_value and loc and loc[-1] == branch and "input" in e:
            value, have_value = e["input"], True
    head = []
    for p in tuple(group[0].get("loc") or ()):
        if _marker(p) and not str(p).startswith("function-"):
            break
        head.append(p)
    if nullable(_fields(head)):
        forms.append("null")
    got = f", not {show(value)}" if have_value else ""
    return param, f"{param} must be {_or(forms)}{got}."


def _prune(errors: list[dict]) -> list[dict]:
    """Drop the union branches that cannot be what the client meant, at every
    level: a branch (the first marker after a location prefix) with a
    `literal_error` (a role or type it does not have) or an `is_instance_of`
    error, as long as another branch of the same union is left."""
    def branch_at(loc, depth):
        # (prefix, branch) for the depth-th marker of `loc`
        seen = 0
        for i, p in enumerate(loc):
            if _marker(p):
                if seen == depth:
                    return tuple(loc[:i]), p
                seen += 1
        return None

    for depth in range(4):
        unions: dict[tuple, dict[str, list[dict]]] = {}
        for e in errors:
            at = branch_at(tuple(e.get("loc") or ()), depth)
            if at is not None:
                unions.setdefault(at[0], {}).setdefault(at[1], []).append(e)
        dropped = set()
        for branches in unions.values():
            for wrong in (("literal_error", "is_instance_of"), ("missing",)):
                live = {b: es for b, es in branches.items() if not any(
                    id(e) in dropped for e in es)}
                bad = [b for b, es in live.items()
                       if any(e.get("type") in wrong for e in es)]
                if len(live) > 1 and len(bad) < len(live):
                    for b in bad:
                        dropped.update(id(e) for e in live[b])
        errors = [e for e in errors if id(e) not in dropped]
    # Variants pydantic does not tag (each wrapped in the same validator): a wrong
    # `type` / `role` literal makes the fields other variants require moot.
    wrong_kind = {_fields(e.get("loc") or ())[:-1] for e in errors
                  if e.get("type") == "literal_error"}
    return [e for e in errors if not (e.get("type") == "missing"
                                      and _fields(e.get("loc") or ())[:-1] in wrong_kind)]


_FORMS = {"list[constrained-int]": "a list of token ids", "list[int]": "a list of token ids",
          "list[list[constrained-int]]": "a list of lists of token ids",
          "list[list[int]]": "a list of lists of token ids", "list[str]": "a list of strings"}


def _union_sentence(param: str, group: list[dict], nullable) -> tuple[str, str]:
    forms = []
    for e in group:
        loc = tuple(e.get("loc") or ())
        named = next((_FORMS[p] for p in reversed(loc) if p in _FORMS), None)
        forms.append(named or _KINDS[e["type"]])
    if nullable(_fields(group[0].get("loc") or ())):
        forms.append("null")
    # "a list" says less than "a list of token ids": keep the precise forms
    if any(f.startswith("a list of") for f in forms):
        forms = [f for f in forms if f != "a list"]
    got = f", not {show(group[0]['input'])}" if "input" in group[0] else ""
    return param, f"{param} must be {_or(sorted(set(forms), key=forms.index))}{got}."


def refusal_line(exc: BaseException, where: str = "") -> str:
    """The one log line a refused request leaves (no traceback): the error's type,
    its parameter and its message on one line."""
    parameter = getattr(exc, "parameter", None)
    text = " ".join(str(exc).split())
    named = f" ({parameter})" if parameter else ""
    return f"Request refused{' in ' + where if where else ''}: {type(exc).__name__}{named}: {text}"


# The mask's own body fields (top level on all three routes).
MASK_FIELDS = ("return_sampling_mask", "return_sampling_mask_logprobs",
               "sampling_mask_format")
# Sampling parameters a client may put at the top level of /inference/v1/generate,
# where that route reads none of them (they belong in `sampling_params`).
GENERATE_SAMPLING_FIELDS = (
    "temperature", "top_k", "top_p", "min_p", "max_tokens", "min_tokens", "seed", "n",
    "stop", "stop_token_ids", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "logprobs", "prompt_logprobs", "ignore_eos", "logit_bias",
    "allowed_token_ids", "bad_words", "skip_special_tokens",
    "include_stop_str_in_output", "structured_outputs")


class MisplacedFieldError(ValueError):
    """A body field the route would silently ignore, where the client meant a known
    one: `parameter` is the right field as the route reads it."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter


class FieldValueError(ValueError):
    """A body field's value that the route's own before-validators would fail on
    without naming it: `parameter` is the field (a 400 naming it, through the
    `validation_messages` handler)."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter


def refuse_non_numbers(data, fields: Collection[str]):
    """A request model's before-validator: each of `fields` present in the body
    `data` (a dict) must be a number (JSON int or float; null is left alone), else
    `FieldValueError` naming it. Returns `data` unchanged."""
    for field in fields:
        value = data.get(field)
        if value is not None and not isinstance(value, (int, float)):
            raise FieldValueError(field, f"{field} must be an integer, not {show(value)}.")
    return data


def _near_mask_field(key: str) -> str | None:
    """The mask field `key` misspells (case, `-`, a letter or two), or None."""
    plain = key.lower().replace("-", "_")
    best, score = None, 0.0
    for field in MASK_FIELDS:
        ratio = 1.0 if plain == field else difflib.SequenceMatcher(None, plain, field).ratio()
        if ratio > score:
            best, score = field, ratio
    return best if score >= 0.9 or (score >= 0.8 and "mask" in plain) else None


def misplaced_field(body, *, declared: Collection[str], generate: bool
                    ) -> tuple[str, str] | None:
    """(the right parameter, message) for a body field the route would ignore
    though the client plainly meant a mask field (a near miss of its name, the
    mask field inside `sampling_params` on generate or inside `extra_body`), or,
    on `/inference/v1/generate` (`generate`), a sampling parameter at the top
    level; None otherwise (other unknown fields keep upstream's handling).
    `declared`: the route's own top-level fields."""
    if not isinstance(body, dict):
        return None
    for key in body:
        if not isinstance(key, str) or key in declared:
            continue
        field = _near_mask_field(key)
        if field is not None:
            return field, (f"{field} is the field's name, not {key!r} (a name this route "
                           f"does not read, so it would be ignored): send {field} at the "
                           "top level of the body.")
        if generate and key in GENERATE_SAMPLING_FIELDS:
            return f"sampling_params.{key}", (
                f"{key} goes inside sampling_params on /inference/v1/generate (at the "
                f"top level it would be ignored): send it as sampling_params.{key}.")
    inner = body.get("sampling_params") if generate else None
    for key in inner if isinstance(inner, dict) else ():
        field = _near_mask_field(key) if isinstance(key, str) else None
        if field is not None:
            return field, (f"{field} goes at the top level of the body, beside "
                           f"sampling_params (inside it, {key!r} would be ignored): move it "
                           "there.")
    extra = body.get("extra_body") if "extra_body" not in declared else None
    for key in extra if isinstance(extra, dict) else ():
        field = _near_mask_field(key) if isinstance(key, str) else None
        if field is not None:
            return field, (f"{field} goes at the top level of the body: extra_body is the "
                           "openai client's argument, not a body field (inside it, "
                           f"{key!r} would be ignored).")
    return None


def refuse_misplaced_fields(cls, data, *, generate: bool):
    """A request model's before-validator: raise `MisplacedFieldError` (a 400 naming
    the right field, through the `validation_messages` handler) for what
    `misplaced_field` finds; return `data` unchanged otherwise."""
    found = misplaced_field(data, declared=set(cls.model_fields), generate=generate)
    if found is not None:
        raise MisplacedFieldError(*found)
    return data


# The sampling parameters whose upstream refusals ("top_k must be 0 (disable), or at
# least 1, got -2.") carry no parameter name.
_NAMED_IN_MESSAGE = re.compile(r"^([a-z_]+) (?:must|cannot|should) ")
SAMPLING_PARAMS = frozenset((*GENERATE_SAMPLING_FIELDS, "max_tokens", "n", "best_of",
                             "top_logprobs", "truncate_prompt_tokens"))


def param_in_message(message: str) -> str | None:
    """The sampling parameter an upstream refusal's message starts with ("min_p must
    be in [0, 1], got 2.0." -> min_p), or None."""
    found = _NAMED_IN_MESSAGE.match(message or "")
    return found.group(1) if found and found.group(1) in SAMPLING_PARAMS else None
