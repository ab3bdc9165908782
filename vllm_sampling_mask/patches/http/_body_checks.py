"""Checks of a request body before the routes read it.

`body_is_an_object`: the OpenAI request subclasses answer a body that is no JSON object
(`[]`) with a 400, where upstream's validators raised an AttributeError (HTTP 500).
Remove when upstream's before-validators check `isinstance(data, dict)` first.
`checked_body` adds the misspelled or misplaced mask fields
(`error_sentences.misplaced_field`), which the routes would ignore.
"""

from __future__ import annotations




def body_is_an_object(cls, data):
    """A request body that is no JSON object (`[]`, `1`) is a 400 naming the fix.
    Upstream's own before-validators call `data.get` first: an AttributeError, HTTP
    500. A validator the subclass declares runs before the parent's."""
    if not isinstance(data, dict):
        raise ValueError(f"the request body must be a JSON object, not {type(data).__name__}")
    return data


def checked_body(cls, data):
    """The OpenAI request subclasses' before-validator: a body that is a JSON object
    (`body_is_an_object`) whose mask fields are spelled and placed as the route
    reads them (`error_sentences.refuse_misplaced_fields`: a near miss such as
    `return_sampling_masks`, or the field inside a raw `extra_body`, is a 400 naming
    the right field; other unknown fields keep upstream's handling)."""
    from vllm_sampling_mask.formats.error_sentences import refuse_misplaced_fields

    return refuse_misplaced_fields(cls, body_is_an_object(cls, data), generate=False)
