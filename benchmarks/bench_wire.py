"""The mask's wire: JSON lists against the packed encodings, same masks, one run.

For each workload, every mask goes through the API server's encoders, exactly as
the route patches call them (a full response: `_full_response.mask_payload`, then, as the
route renders the response's `model_dump()`, the lists written from the mask's
arrays (`_full_response.MaskedBody`) or the packed object through pydantic's dump and
Starlette's `json.dumps`; a stream chunk: the mask's text written straight from its
arrays, `SamplingMask.to_lists_json` or `to_packed_json`, written into a one-token
`/v1/completions` chunk event and encoded to the bytes sent), and is decoded back with `SamplingMask.from_response` (checked equal). Five
encoders: "lists" (the default), "lists-dumps" (the same lists through pydantic's
dump and `json.dumps`, as full responses were written before 2026-12-06), "v2" (`sampling_mask_format: "packed"`, what the
server writes: `packed_wire.encode_packed`, format `packed-rice-v2`, base85, with
the compiled encoder `_packed_native` where it is built), "v2py" (the same objects
from packed_wire's numpy and plain-Python encoders, what an install without a C
compiler serves) and "v1" (the earlier packed layout,
`packed_wire.encode_packed_v1`, base64 varints, still decoded; for comparison).
Printed per workload and per shape (a full response of T tokens; a stream chunk of
one token):

    <enc> B/id        the JSON text of the `sampling_mask` value, over the ids it holds
    <enc> bin B/id    (packed) the binary payload before its text encoding, over the ids
    <enc> us/tok      API-server CPU (process time, the best of at least 5 rounds, the
                      encoders taking turns) to encode, per masked token
    <enc>/lists CPU   the ratio of that encoder's CPU time to the lists encoder's

Workloads:
    prime-rl   V = 151,936, support sizes lognormal with mean ~8 and p99 ~80
               (clipped to [1, 2048]), ids uniform (a random-weight model's supports)
    top_k50    V = 151,936, every support 50 ids, uniform
    demo       masks the demo model returns over HTTP (`--demo`: starts one server
               on the V1 runner, asks the same seeded requests with each format;
               both formats must decode to the same masks)

    python benchmarks/bench_wire.py                 # the synthetic workloads
    python benchmarks/bench_wire.py --demo          # and the demo model over HTTP
"""

from __future__ import annotations

import argparse
import base64
import json
import time

import numpy as np

from vllm_sampling_mask.formats import packed_wire
from vllm_sampling_mask.formats.packed_wire import (LISTS_JSON, PACKED_JSON, b85decode, encode_packed,
                                            encode_packed_v1)
from vllm_sampling_mask.frontend.sampling_mask import SamplingMask

V_BIG = 151_936


def _pydantic_adapter():
    from pydantic import TypeAdapter
    return TypeAdapter(list[list[int]] | dict[str, str | int] | None)


def synthetic(kind: str, tokens: int, rng) -> SamplingMask:
    if kind == "prime-rl":
        sizes = np.clip(np.rint(rng.lognormal(1.058, 1.429, tokens)), 1, 2048).astype(int)
    else:
        sizes = np.full(tokens, 50)
    rows = [np.sort(rng.choice(V_BIG, s, replace=False)) for s in sizes]
    return SamplingMask.from_lists(rows)


ENCODERS = ("lists", "lists-dumps", "v1", "v2py", "v2")
# how Starlette's `JSONResponse` writes a body (the routes' full responses)
RESPONSE_JSON = dict(ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))


def mask_text(mask: SamplingMask, encoder: str) -> str:
    """A stream chunk's `sampling_mask` text as `_stream.StreamMasks` writes it (the
    compiled call itself where it is built)."""
    if encoder == "lists":
        return (LISTS_JSON is not None and LISTS_JSON(mask.ids, mask.offsets)
                or mask.to_lists_json())
    if encoder == "lists-dumps":
        return json.dumps(mask.token_ids, separators=(",", ":"))
    if encoder == "v1":
        return json.dumps(encode_packed_v1(mask.ids, offsets=mask.offsets))
    if encoder == "v2py":
        native, packed_wire._packed_native = packed_wire._packed_native, None
        try:
            return mask.to_packed_json()
        finally:
            packed_wire._packed_native = native
    return (PACKED_JSON is not None and PACKED_JSON(mask.ids, mask.offsets)
            or mask.to_packed_json())


# a one-token `/v1/completions` chunk as upstream writes it
CHUNK = ('data: {"id":"cmpl-8f1c2a3b4c5d6e7f8a9b0c1d2e3f4a5b","object":"text_completion",'
         '"created":1764672000,"model":"demo","choices":[{"index":0,"text":" hello",'
         '"logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[1234]}],'
         '"usage":null}\n\n')


def chunk_bytes(mask: SamplingMask, encoder: str) -> bytes:
    """The chunk event with the mask written in (`_stream._with_fields`), as the
    bytes the response sends."""
    from vllm_sampling_mask.patches.http._stream import _with_fields
    return _with_fields(CHUNK, '"sampling_mask":' + mask_text(mask, encoder)).encode()


def full_bytes(mask: SamplingMask, encoder: str, adapter) -> bytes:
    """A full response's `sampling_mask` value as the route writes it: lists from
    `_full_response.mask_payload` (a `MaskLists`, then the text `MaskedBody.render` writes),
    anything else the field's pydantic dump written by `json.dumps` as Starlette's
    `JSONResponse` does."""
    if encoder == "lists":
        from vllm_sampling_mask.patches.http._full_response import mask_payload
        return mask_payload(mask, packed=False).mask.to_lists_json().encode()
    return json.dumps(adapter.dump_python(payload(mask, encoder)), **RESPONSE_JSON).encode()


def payload(mask: SamplingMask, encoder: str):
    # the packed objects of `_full_response.mask_payload`; "v2py" without the compiled
    # encoder; "v1" is the earlier packed layout; the lists as Python lists
    if encoder == "v2":
        return encode_packed(mask.ids, offsets=mask.offsets)
    if encoder == "v2py":
        native, packed_wire._packed_native = packed_wire._packed_native, None
        try:
            return encode_packed(mask.ids, offsets=mask.offsets)
        finally:
            packed_wire._packed_native = native
    if encoder == "v1":
        return encode_packed_v1(mask.ids, offsets=mask.offsets)
    return mask.token_ids


def binary_size(obj: dict) -> int:
    if obj["format"] == "packed-varint-v1":
        return len(base64.b64decode(obj["data"]))
    return len(b85decode(obj["data"]))


def measure(masks: list[SamplingMask], label: str, repeat: int = 5,
            budget: float = 0.3) -> list[dict]:
    """One row per shape: each whole mask as one full response, then its tokens
    one per stream chunk (the first 2 masks). The encoders take turns, round
    after round (at least `repeat`, and until each has run `budget` seconds of
    CPU), each keeping its best round."""
    adapter = _pydantic_adapter()
    rows = []
    shapes = (("full", masks, lambda m, encoder: full_bytes(m, encoder, adapter)),
              ("chunk", [SamplingMask.from_counts(m[t], [len(m[t])]) for m in masks[:2]
                         for t in range(len(m))], chunk_bytes))
    for shape, work, dump in shapes:
        n_ids = sum(len(m.ids) for m in work)
        n_tok = sum(len(m) for m in work)
        row = {"workload": label, "shape": shape, "T": len(work[0]), "responses": len(work),
               "mean size": round(n_ids / n_tok, 2)}
        for encoder in ENCODERS:
            texts = [dump(m, encoder) for m in work]
            size = sum(len(t) for t in texts)
            if shape == "chunk":   # the mask's own text, as for a full response
                texts = [mask_text(m, encoder) for m in work]
            for m, text in zip(work, texts):
                choice = {"index": 0, "sampling_mask": json.loads(text)}
                assert SamplingMask.from_response(choice) == m
            row[f"{encoder} B/id"] = round(size / n_ids, 3)
            if not encoder.startswith("lists"):
                raw = sum(binary_size(payload(m, encoder)) for m in work)
                row[f"{encoder} bin B/id"] = round(raw / n_ids, 3)
        best = dict.fromkeys(ENCODERS, float("inf"))
        spent = dict.fromkeys(ENCODERS, 0.0)
        rounds = 0
        while rounds < repeat or min(spent.values()) < budget:
            for encoder in ENCODERS:
                t0 = time.process_time()
                for m in work:
                    dump(m, encoder)
                took = time.process_time() - t0
                best[encoder] = min(best[encoder], took)
                spent[encoder] += took
            rounds += 1
        for encoder in ENCODERS:
            row[f"{encoder} us/tok"] = round(best[encoder] / n_tok * 1e6, 3)
        for encoder in ENCODERS[1:]:
            row[f"{encoder}/lists CPU"] = round(row[f"{encoder} us/tok"] / row["lists us/tok"], 3)
        rows.append(row)
    return rows


def run_demo(requests: int, tokens: int) -> list[SamplingMask]:
    import os
    import socket
    import tempfile

    import httpx

    from vllm_sampling_mask import DEMO_MODEL
    from vllm_sampling_mask.tools.demo import DEMO_PROMPTS, serving

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = os.path.join(tempfile.gettempdir(), f"bench-wire-{port}.log")
    out = {"lists": [], "packed": []}
    with serving(port, log, runner="v1") as base, httpx.Client(timeout=300) as client:
        for i in range(requests):
            for fmt in ("lists", "packed"):
                body = {"model": DEMO_MODEL, "prompt": DEMO_PROMPTS[i % len(DEMO_PROMPTS)],
                        "max_tokens": tokens, "temperature": 1.0,
                        "top_k": (20, 50, 100, 200)[i % 4], "top_p": (1.0, 0.9)[i % 2],
                        "seed": i, "ignore_eos": True, "sampling_mask_format": fmt}
                r = client.post(f"{base}/v1/completions", json=body)
                r.raise_for_status()
                out[fmt].append(SamplingMask.from_response(r.json()))
    assert out["lists"] == out["packed"], "the two formats decoded to different masks"
    return out["lists"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="64,1024", help="tokens per full response (list)")
    ap.add_argument("--responses", type=int, default=40)
    ap.add_argument("--demo", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not packed_wire.NATIVE:
        print("note: the compiled encoder is not built here; v2 is v2py")
    rng = np.random.default_rng(args.seed)
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        for kind in ("prime-rl", "top_k50"):
            masks = [synthetic(kind, tokens, rng) for _ in range(args.responses)]
            rows += measure(masks, kind)
    if args.demo:
        rows += measure(run_demo(16, 64), "demo (HTTP, V=4096)")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
