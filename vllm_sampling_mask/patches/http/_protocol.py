"""The mask's fields declared on upstream's OpenAI protocol classes, for the two
OpenAI routes (`chat_protocol`, `completion_protocol`: one call of
`declare_openai_fields` each, with the route's three class names).

- The request class is replaced with a subclass that declares the body fields
  `return_sampling_mask: bool | None` and `return_sampling_mask_logprobs: bool | None`
  (strict: "yes" is a 400 naming it) and `sampling_mask_format: "lists" | "packed" |
  None` (any other value a 400 naming it), checks the body first (`_body_checks`), and
  whose `to_sampling_params` puts the two switches into the request's
  `SamplingParams.extra_args` (other extra args kept; absent leaves them alone), where
  the input processor decides (`_body_fields`).
- The choice and response classes are replaced with subclasses that declare
  `sampling_mask` (lists, or the packed object), `sampling_mask_logprobs` and
  `sampling_mask_log_kept` (the response class too: pydantic serialises a list field by
  its declared item type; its `model_dump()` leaves a lists mask for the
  `json_response` patch to write from its arrays: `_full_response.WritesMaskLists`).
- The names are replaced as the protocol module finishes executing, so the route
  (`api_router`) parses the subclass and the serving module builds the subclasses.
- On a release whose `check_logprobs` compares logprobs fields as sent
  (`Release.logprobs_compared_raw`: 0.24), the request subclass first refuses a value
  there that is no number, naming the field (upstream's comparison raised a TypeError,
  a 400 naming none; `error_sentences.refuse_non_numbers`; that part goes with 0.24:
  vLLM #49144 type-checks them from 0.27).
"""

from __future__ import annotations

from pydantic import model_validator

from vllm_sampling_mask.patches.http._body_checks import checked_body
from vllm_sampling_mask.patches.http._body_fields import BodyField, FORMAT_ARG, FormatField, LogKeptField, LogprobsField, MaskField, ReasonField, body_field, format_field, forward_body_field, logprobs_field
from vllm_sampling_mask.patches.http._full_response import WritesMaskLists
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.frontend.validation import LOGPROBS_ARG, MASK_ARG


def declare_openai_fields(module, request: str, choice: str, response: str,
                          release: Release) -> None:
    """In an OpenAI protocol module, replace the request class `request` with a
    subclass declaring the body field (forwarded by its `to_sampling_params`) and
    checking the body first (`checked_body`; then, where the release's
    `check_logprobs` compares them as sent, that its logprobs fields are numbers),
    and the response classes (`declare_choice_fields`)."""
    from vllm_sampling_mask.formats.error_sentences import refuse_non_numbers
    from vllm_sampling_mask.patches._wrap import wraps

    numbers = release.logprobs_compared_raw.get(request, ())

    def checked(cls, data):
        return refuse_non_numbers(checked_body(cls, data), numbers)

    Request = type(request, (getattr(module, request),),
                   {"__annotations__": {MASK_ARG: BodyField, FORMAT_ARG: FormatField,
                                        LOGPROBS_ARG: BodyField},
                    MASK_ARG: body_field(), FORMAT_ARG: format_field(),
                    LOGPROBS_ARG: logprobs_field(),
                    "_body_is_an_object": model_validator(mode="before")(
                        classmethod(checked)),
                    "__module__": module.__name__})
    setattr(module, request, Request)
    declare_choice_fields(module, choice, response)

    @wraps(module, f"{request}.to_sampling_params")
    def to_sampling_params(wrapped, self, args, kwargs):
        return forward_body_field(wrapped(*args, **kwargs), self.return_sampling_mask,
                                  self.return_sampling_mask_logprobs)


def declare_choice_fields(module, choice: str, response: str) -> None:
    """In a protocol module, replace the response classes `choice` / `response`
    with subclasses declaring the mask's fields on the choice (the response too:
    pydantic serialises a list field by its declared item type) and writing a
    lists mask from its arrays when the route renders the response
    (`WritesMaskLists`)."""
    Choice = type(choice, (getattr(module, choice),),
                  {"__annotations__": {"sampling_mask": MaskField,
                                       "sampling_mask_logprobs": LogprobsField,
                                       "sampling_mask_log_kept": LogKeptField,
                                       "sampling_mask_reason": ReasonField},
                   "sampling_mask": None, "sampling_mask_logprobs": None,
                   "sampling_mask_log_kept": None, "sampling_mask_reason": None,
                   "__module__": module.__name__})
    Response = type(response, (WritesMaskLists, getattr(module, response)),
                    {"__annotations__": {"choices": list[Choice]},
                     "__module__": module.__name__})
    setattr(module, choice, Choice)
    setattr(module, response, Response)
