"""Sampling masks under structured outputs (a JSON schema, a regex, a choice), on both
runners (on CPU: V1 natively, Model Runner V2 through Triton's interpreter).

The grammar's allowed set at each position is computed here independently of vLLM's
sampler: xgrammar (vLLM's default backend) compiles the same grammar against the demo
model's tokenizer, a `GrammarMatcher` is fed each emitted prefix, and its next-token
bitmask is the allowed set. The reference support of each emitted token is then
`reference_support` of the transformers logits with every id outside the allowed set
at -inf (the grammar applies before temperature, top-k and top-p, as in the engine),
intersected with the allowed set. What must hold, per grammar:

- every mask against that reference; every emitted token accepted by the matcher,
  and a finished completion is a complete match (the grammar's own end);
- where the grammar allows one token (a forced character, the end of string), the
  mask is that one id;
- the grammar narrowed supports: some mask is smaller than the support the same
  sampling parameters give without the grammar (so the test can fail).

A grammar truncates the support by itself; the requests here ask for their masks
(`return_sampling_mask: true`), as a grammar-only request without top-k/top-p/min-p
must (with the switch null such a request has no mask: docs/sampling_mask.md).
"""

from __future__ import annotations

import contextlib
import json
import re

import pytest
import torch
from conftest import ENGINE_KWARGS, check_alignment, hf_logits, native_v1, reference_support
from releases_facts import facts

from vllm_sampling_mask.patches.apply import upstream_release

RUNNERS = ["v1", "mrv2"]   # V1 natively; Model Runner V2 through Triton's interpreter
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "n": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["name", "n", "ok"], "additionalProperties": False}
REGEX = r"def [a-z]{2,6}\((x|y|z)\):\n    return [0-9]{1,3}"
CHOICE = ["return None", "return self", "raise ValueError"]
PROMPT = "def main():\n    "
# kind -> (the grammar, the sampling parameters, seed)
GRAMMARS = {
    "json": (SCHEMA, dict(temperature=0.7, top_k=20), 3),
    "regex": (REGEX, dict(temperature=1.0, top_k=0, top_p=0.95), 4),
    "choice": (CHOICE, dict(temperature=1.0, top_k=0), 5),
}
TOKENS = 64


@pytest.fixture(scope="module", params=[
    pytest.param(runner, marks=pytest.mark.mrv2 if runner == "mrv2" else ())
    for runner in RUNNERS])
def llm(request):
    from vllm import LLM
    release = upstream_release()
    if request.param == "mrv2" and not facts(release).mrv2_cpu_grammar and \
            not torch.cuda.is_available():
        pytest.skip(f"vLLM {release.version}'s Model Runner V2 cannot apply a grammar on "
                    "a CPU host (releases_facts' mrv2_cpu_grammar: upstream's bitmask index "
                    "copy in v1/worker/gpu/structured_outputs.py asks for pinned memory, "
                    "\"pin_memory=True requires a CUDA or other accelerator backend; no "
                    "pinned memory allocator is available on this system.\", and the "
                    "engine dies)")
    kwargs = dict(ENGINE_KWARGS, max_model_len=256, max_num_seqs=4)
    with native_v1() if request.param == "v1" else contextlib.nullcontext():
        engine = LLM(**kwargs)
    engine.runner = request.param
    yield engine
    del engine


@pytest.fixture(scope="module")
def outputs(llm) -> dict:
    """kind -> the engine's output for the three grammars, generated as one batch."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams
    params = [SamplingParams(**case, max_tokens=TOKENS, seed=seed, logprobs=0,
                             structured_outputs=StructuredOutputsParams(**{kind: grammar}),
                             extra_args={"return_sampling_mask": True})
              for kind, (grammar, case, seed) in GRAMMARS.items()]
    return dict(zip(GRAMMARS, llm.generate([PROMPT] * len(params), params)))


def compiled(tokenizer, kind: str, vocab: int):
    """The grammar of `kind`, compiled by xgrammar against `tokenizer` (a choice is an
    alternation of its strings)."""
    import xgrammar as xgr
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer,
                                                                      vocab_size=vocab))
    grammar = GRAMMARS[kind][0]
    if kind == "json":
        return compiler.compile_json_schema(json.dumps(grammar))
    if kind == "regex":
        return compiler.compile_regex(grammar)
    return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in grammar))


def allowed_sets(tokenizer, kind: str, token_ids, vocab: int):
    """The grammar's allowed ids before each of `token_ids`, and whether the matcher
    has terminated after them; fails if the grammar refuses a token."""
    import xgrammar as xgr
    matcher = xgr.GrammarMatcher(compiled(tokenizer, kind, vocab))
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    allowed = []
    for t, token in enumerate(token_ids):
        matcher.fill_next_token_bitmask(bitmask)
        words = bitmask[0].to(torch.int64) & 0xFFFFFFFF
        bits = ((words[:, None] >> torch.arange(32)) & 1).bool().view(-1)[:vocab]
        allowed.append(set(torch.nonzero(bits).view(-1).tolist()))
        assert matcher.accept_token(token), (kind, t, token)
    return allowed, matcher.is_terminated()


def grammar_reference(logits_row, allowed: set[int], case: dict):
    """(surely_in, surely_out) of the processed distribution under the grammar."""
    masked = torch.full_like(logits_row, float("-inf"))
    ids = torch.tensor(sorted(allowed))
    masked[ids] = logits_row[ids]
    surely_in, surely_out = reference_support(masked, case["temperature"], case["top_k"],
                                              case.get("top_p", 1.0))
    return surely_in & allowed, surely_out | (set(range(len(logits_row))) - allowed)


@pytest.mark.parametrize("kind", list(GRAMMARS))
def test_masks_are_the_grammars_allowed_set_within_the_reference(
        outputs, kind, tokenizer, hf_model):
    out = outputs[kind]
    c = out.outputs[0]
    vocab = hf_model.config.vocab_size
    case = GRAMMARS[kind][1]
    mask = check_alignment(c, vocab)
    allowed, terminated = allowed_sets(tokenizer, kind, c.token_ids, vocab)
    logits = hf_logits(hf_model, out.prompt_token_ids, c.token_ids)
    ambiguous = singletons = narrowed = 0
    for t, support in enumerate(mask.token_ids):
        surely_in, surely_out = grammar_reference(logits[t], allowed[t], case)
        got = set(support)
        assert surely_in <= got, (kind, t, sorted(surely_in - got))
        assert not (got & surely_out), (kind, t, sorted(got & surely_out))
        ambiguous += vocab - len(surely_in) - len(surely_out)
        if len(allowed[t]) == 1:
            assert support == sorted(allowed[t]), (kind, t)
            singletons += 1
        free_in, _ = reference_support(logits[t], case["temperature"], case["top_k"],
                                       case.get("top_p", 1.0))
        narrowed += len(support) < len(free_in)
    assert ambiguous <= len(mask) // 10
    assert singletons >= 1, f"{kind}: no position where the grammar allowed one token"
    assert narrowed >= 1, f"{kind}: the grammar never narrowed a support"
    if c.finish_reason == "stop":
        assert terminated
        text = c.text
        if kind == "json":
            value = json.loads(text)
            assert set(value) == {"name", "n", "ok"} and isinstance(value["ok"], bool)
        elif kind == "regex":
            assert re.fullmatch(REGEX, text), text
        else:
            assert text in CHOICE
    else:
        assert c.finish_reason == "length" and len(c.token_ids) == TOKENS


def test_a_choice_and_a_regex_run_to_their_end(outputs):
    """The bounded grammars finish within the token budget: the end-of-string position
    (a singleton: only EOS allowed) is part of what the test above checks."""
    for kind in ("regex", "choice"):
        assert outputs[kind].outputs[0].finish_reason == "stop", kind
