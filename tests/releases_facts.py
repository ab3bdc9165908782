"""What the tests know of each supported vLLM release that the package never reads.

`vllm_sampling_mask.releases` holds what the overlay reads at run time (where a seam
lives, which bugs a release has, what the extras admit). The facts here decide only
which tests can run on a release and what they hold it to: which Python its wheels
need, which Triton its torch brings, what stock vLLM can run on a CPU host.
`tests/test_releases.py` checks each of them against the installed vLLM.

`CHANGES` is keyed by release, oldest first, in the style of `releases._after`: the
oldest release states every fact, each later one only the facts it changed, and a
fact holds from the release that set it until one that changes it. A release that
changed none of these facts has no entry (a new release is one `_after` line in
`releases.py`, plus one entry here only where it changed one of these facts).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from vllm_sampling_mask import releases
from vllm_sampling_mask.releases import Release

__all__ = ["CHANGES", "Facts", "changed", "facts", "installed"]


@dataclass(frozen=True)
class Facts:
    """The test-only facts of one release (every field states one; no defaults)."""

    # the oldest Python the release's wheels are built for
    python: tuple[int, int]
    # the Triton minor release its torch pin brings (the interpreter enablers are
    # checked against it): torch 2.13 -> Triton 3.9, 0.24's torch 2.11 -> 3.6, 0.33's
    # torch 2.14 -> 3.8
    triton: str
    # a MoE model's forward runs on a CPU host. 0.24's CPU fused-MoE torch path builds
    # its SiLU activation (`SiluAndMul`, a CustomOp) on every call, outside the vLLM
    # config, so the first forward fails "Current vLLM config is not set" (stock 0.24.0
    # too); 0.27 calls the static `SiluAndMul.forward_native` instead
    cpu_moe_runs: bool
    # `/v1/completions` takes `bad_words` (vLLM #46793). 0.24's `CompletionRequest` has
    # no such field and ignores one sent, as any field it does not know (upstream's
    # "present in the request but ignored" warning); `/v1/chat/completions` has it
    completion_bad_words: bool
    # the speculative methods with no head of their own (n-gram lookup, a draft
    # model) that Model Runner V2 accepts: before 0.31 only EAGLE/MTP heads, which
    # it takes on every supported release ("Model Runner V2 does not yet support:
    # ngram/ngram_gpu speculative decoding", "... speculative method 'draft_model'");
    # 0.31 adds draft_model, 0.32 ngram
    mrv2_speculators: tuple[str, ...]
    # the V1 runner runs speculative decoding on a CPU host (stock vLLM as much as
    # the overlay). Not on 0.24: its CPU override of the recovered-token kernel takes
    # no `USE_FP64_GUMBEL`, which its rejection sampler passes
    # ("_sample_recovered_tokens_kernel_impl() got an unexpected keyword argument
    # 'USE_FP64_GUMBEL'"); not on 0.30: its rejection sampler launches its kernels
    # through the warm-up dispatcher, and the CPU platform overrides none of them
    # until 0.31 ("Cannot inspect kernel parameters for function"); not on 0.34,
    # which has no V1 runner
    v1_cpu_speculation: bool
    # Model Runner V2 applies a structured-output grammar on a CPU host (under
    # Triton's interpreter). Not before 0.28: its grammar bitmask's index copy asks
    # for pinned memory unconditionally (`pin_memory=True`; "pin_memory=True requires
    # a CUDA or other accelerator backend"), and the engine dies; 0.28 pins only
    # where pinning is available
    mrv2_cpu_grammar: bool


CHANGES: dict[str, dict[str, object]] = {
    "0.24.0": dict(python=(3, 10), triton="3.6", cpu_moe_runs=False,
                   completion_bad_words=False, mrv2_speculators=(),
                   v1_cpu_speculation=False, mrv2_cpu_grammar=False),
    # its CPU wheel's torch 2.13 (Triton 3.9); `/v1/completions` takes `bad_words`
    # (#46793); the CPU fused-MoE path and the V1 rejection sampler's CPU overrides run
    "0.27.1": dict(triton="3.9", cpu_moe_runs=True, completion_bad_words=True,
                   v1_cpu_speculation=True),
    # MRv2's grammar bitmask pins memory only where it can
    "0.28.0": dict(mrv2_cpu_grammar=True),
    # the rejection sampler's kernels go through the warm-up dispatcher, which the CPU
    # platform does not override
    "0.30.0": dict(v1_cpu_speculation=False),
    # ... until 0.31, which overrides them; MRv2 speculates with a draft model
    "0.31.0": dict(v1_cpu_speculation=True, mrv2_speculators=("draft_model",)),
    "0.32.0": dict(python=(3, 11), mrv2_speculators=("draft_model", "ngram")),
    # the CUDA wheel's torch 2.14 (Triton 3.8)
    "0.33.0": dict(triton="3.8"),
    # no V1 runner
    "0.34.0": dict(v1_cpu_speculation=False),
}


@lru_cache(maxsize=None)
def _facts(version: str) -> Facts:
    if releases.by_version(version) is None:
        raise KeyError(f"{version!r} is no listed release ({', '.join(releases.SUPPORTED)})")
    stated: dict[str, object] = {}
    for release in releases.RELEASES:
        stated.update(CHANGES.get(release.version, {}))
        if release.version == version.split("+", 1)[0]:
            break
    return Facts(**stated)


def facts(release: Release | str) -> Facts:
    """The test-only facts of `release` (a profile, or a listed version): those of
    the newest entry of `CHANGES` that set each, up to and including it."""
    return _facts(release if isinstance(release, str) else release.version)


def installed() -> Facts:
    """The test-only facts of the installed vLLM release."""
    from vllm_sampling_mask.patches.apply import upstream_release
    return facts(upstream_release())


def changed(before: Release | str, after: Release | str) -> dict[str, object]:
    """The facts `after` states otherwise than `before`."""
    old, new = facts(before), facts(after)
    return {f.name: getattr(new, f.name) for f in dataclasses.fields(Facts)
            if getattr(new, f.name) != getattr(old, f.name)}
