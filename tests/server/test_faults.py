"""Faults, against a real `vllm serve` (the stock CLI, patched by the site hook, V1
runner natively, Model Runner V2 where the release has no V1 runner; mask on) that each
scenario starts for itself and destroys:

- the engine core process is SIGKILLed while requests are in flight on the three
  routes (running and still queued, streamed and not);
- the API server gets SIGTERM while requests are in flight, with vLLM's default
  `--shutdown-timeout 0` (abort in-flight requests; the engine core busy) and with
  `--shutdown-timeout 60` (drain them).

What vLLM 0.27.1 does, and what these tests pin:
- engine death: `AsyncLLM`'s output handler raises `EngineDeadError` into every
  request; a request not yet answered gets HTTP 500 ("EngineCore encountered an
  issue..."), a stream already started gets an error event (code 500) and `[DONE]`.
  Upstream's `engine_error_handler` (and, for streams only, its 5 s watchdog) sets
  uvicorn's `should_exit` unless `VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1`, so the API
  server stops listening and exits, with code 0.
- SIGTERM (`launcher.serve_http`): the engine client shuts down first, then uvicorn.
  Timeout 0 (the default): the API server SIGTERMs the engine core and SIGKILLs it
  at once; the engine core aborts its requests (a 200 with `finish_reason: "abort"`
  and the tokens so far) only if it gets to that between steps before the kill. A
  busy engine core (SIGSTOPped here, to make it deterministic) never does: upstream
  answered no client, and uvicorn (no graceful-shutdown timeout) waited for every
  client before the process exited. Timeout > 0: the engine core finishes every
  running request, answers a new one with "abort" and no token, then exits;
  `/health` stays 200 while it drains. A request that reached the API server after
  the engine core finished draining was never answered upstream, and again the
  process exited only once that client gave up.
  The fork's `shutdown_answers` patch finishes every request still pending once the
  engine client has shut down, with upstream's abort output: the busy-core clients
  get a 200, `finish_reason: "abort"`, their tokens so far and their masks, within
  milliseconds; the late request gets the same with no token (or upstream's 500, when
  the engine core's exit notice comes first); the server exits at once.

Every in-flight client runs in a thread with a read timeout, so a hang fails a test
instead of hanging the run; the bounds are hang checks, not speed tests.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from dataclasses import dataclass, field

import psutil
import pytest
import requests

from conftest import free_port, host_env, server_runner

from vllm_sampling_mask import DEMO_MODEL, SamplingMask
from vllm_sampling_mask.tools.demo import serving

HANG = 30.0          # s: a client still without an answer by then hangs
ABORT_HANG = 10.0    # s: the same, for requests SIGTERM aborts (an abort takes ms)
ANSWERED = 5.0       # s: a request pending at shutdown is answered by then (takes ms)
EXIT_PROMPT = 20.0   # s: the server tree is gone by then (took 9 s on 0.34, < 5 s on 0.32), from
                     # SIGTERM, or draining from the drain's end (`Fault.shutdown_from`)
EXIT_BOUND = 60.0    # s: the server's process tree is gone by then
ENGINE_DEAD = "EngineCore encountered an issue"


def engine_dead(message: str) -> bool:
    """Whether a 500's message (a response's or a stream's error event's) is an engine
    death's: the error's own text, or what the release's error handler gives clients
    instead where it keeps that text for its log (0.33 on: `EngineDeadError.CLIENT_MESSAGE`)."""
    from vllm.v1.engine.exceptions import EngineDeadError
    answers = (ENGINE_DEAD, getattr(EngineDeadError, "CLIENT_MESSAGE", ENGINE_DEAD))
    return any(answer in message for answer in answers)
SAMPLING = dict(temperature=1.0, top_k=20, ignore_eos=True)


# -- clients ---------------------------------------------------------------------------

def request_for(route: str, stream: bool, max_tokens: int) -> tuple[str, dict]:
    """(path, body) of one masked request on `route`, its tokens and masks returned."""
    if route == "generate":
        return "/inference/v1/generate", {
            "model": DEMO_MODEL, "token_ids": [5, 6, 7], "stream": stream,
            "sampling_params": {**SAMPLING, "max_tokens": max_tokens}}
    common = {"model": DEMO_MODEL, "stream": stream, "max_tokens": max_tokens,
              "return_token_ids": True, **SAMPLING}
    if route == "completions":
        return "/v1/completions", {**common, "prompt": "import os\n"}
    return "/v1/chat/completions", {
        **common, "messages": [{"role": "user", "content": "Reverse a list."}]}


class Client(threading.Thread):
    """One request in its own thread: status, body or stream events, timings.
    A read that waits longer than `timeout` ends it with ReadTimeout."""

    def __init__(self, base: str, route: str, stream: bool, max_tokens: int,
                 timeout: float = HANG) -> None:
        super().__init__(daemon=True, name=f"{route}{'-stream' if stream else ''}")
        self.url_path, self.body = request_for(route, stream, max_tokens)
        self.base, self.stream, self.timeout = base, stream, timeout
        self.status: int | None = None
        self.json: dict | None = None        # a non-streamed body, or an HTTP error
        self.chunks: list[dict] = []         # stream events with choices
        self.errors: list[dict] = []         # stream error events
        self.done = False                    # the stream ended with [DONE]
        self.after_error: list[bytes] = []   # data events after an error event
        self.exc: BaseException | None = None
        self.first_chunk = threading.Event()
        self.started_at: float | None = None
        self.ended_at: float | None = None

    def run(self) -> None:
        self.started_at = time.monotonic()
        try:
            with requests.post(self.base + self.url_path, json=self.body, stream=True,
                               timeout=(5, self.timeout)) as r:
                self.status = r.status_code
                if not self.stream or r.status_code != 200:
                    self.json = r.json()
                    return
                for line in r.iter_lines():
                    if not line:
                        continue
                    assert line.startswith(b"data: "), line
                    data = line[len(b"data: "):]
                    if self.errors and data != b"[DONE]":
                        self.after_error.append(data)
                    if data == b"[DONE]":
                        self.done = True
                        continue
                    event = json.loads(data)
                    if "error" in event:
                        self.errors.append(event)
                    else:
                        self.chunks.append(event)
                        self.first_chunk.set()
        except BaseException as exc:  # noqa: BLE001 - recorded, asserted by the tests
            self.exc = exc
        finally:
            self.ended_at = time.monotonic()
            self.first_chunk.set()

    def waited(self, since: float) -> float:
        """Seconds from `since` until the client had its whole answer."""
        return self.ended_at - since

    def describe(self) -> str:
        return (f"{self.name}: status={self.status} exc={self.exc!r} chunks="
                f"{len(self.chunks)} errors={self.errors} done={self.done} "
                f"json={json.dumps(self.json)[:300] if self.json else None}")


def finish_reason(client: Client) -> str | None:
    if client.stream:
        reasons = [c["finish_reason"] for chunk in client.chunks
                   for c in chunk["choices"] if c.get("finish_reason")]
        assert len(reasons) <= 1, reasons
        return reasons[0] if reasons else None
    return client.json["choices"][0]["finish_reason"]


def tokens_and_mask(client: Client) -> tuple[list[int], SamplingMask]:
    """The client's generated token ids and their mask (streamed: joined), checked:
    one support per token, each sorted, unique, holding its token."""
    if client.stream:
        chunks = [c for c in client.chunks if c.get("choices")]
        token_ids = [t for chunk in chunks for c in chunk["choices"]
                     for t in (c.get("token_ids") or [])]
        mask = SamplingMask.from_response(chunks)
    else:
        choice = client.json["choices"][0]
        token_ids, mask = choice["token_ids"], SamplingMask.from_response(choice)
    assert len(mask) == len(token_ids)
    for token, support in zip(token_ids, mask.token_ids):
        assert token in support and support == sorted(set(support)), (token, support)
    return token_ids, mask


# -- the server's processes ------------------------------------------------------------

def api_server(port: int) -> psutil.Process:
    """The `vllm serve` process `serving` started for `port` (a child of this one)."""
    for child in psutil.Process().children():
        try:
            if str(port) in child.cmdline():
                return child
        except psutil.NoSuchProcess:
            continue
    raise LookupError(f"no vllm serve child on port {port}")


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def engine_core(tree: list[psutil.Process]) -> psutil.Process:
    for proc in tree:
        if "EngineCore" in proc.name():
            return proc
    raise LookupError(f"no EngineCore among {[p.name() for p in tree]}")


def gauge(base: str, name: str) -> float:
    text = requests.get(base + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{"))


def wait_until(predicate, timeout: float, what: str, step: float = 0.05) -> float:
    """Poll `predicate` until true; returns when (monotonic). Fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def warm_up(base: str) -> None:
    """The first two requests after start-up are slow: out of the way first."""
    path, body = request_for("generate", False, 4)
    for _ in range(2):
        requests.post(base + path, json=body, timeout=120).raise_for_status()


def in_flight(base: str, clients: list[Client], running: int, waiting: int = 0,
              queued: tuple[Client, ...] = ()) -> None:
    """Until every stream among `clients` but the `queued` ones has a chunk and the
    engine reports `running` requests running and `waiting` queued; fails as soon
    as a client ends."""
    def ready() -> bool:
        ended = [c.describe() for c in clients if not c.is_alive()]
        assert not ended, f"clients ended before the fault: {ended}"
        return (all(c.first_chunk.is_set() for c in clients
                    if c.stream and c not in queued)
                and gauge(base, "vllm:num_requests_running") >= running
                and gauge(base, "vllm:num_requests_waiting") >= waiting)
    wait_until(ready, HANG, f"{running} requests running, {waiting} waiting")


def join_all(clients: list[Client], since: float) -> None:
    for c in clients:
        c.join(max(0.0, since + HANG + 5 - time.monotonic()))
    hung = [c.name for c in clients if c.is_alive()]
    assert not hung, f"clients hung: {hung}"


def wait_exit(api: psutil.Process, tree: list[psutil.Process], since: float):
    """(exit code, seconds to exit, processes of the tree still alive after the bound)."""
    try:
        code = api.wait(max(1.0, since + EXIT_BOUND - time.monotonic()))
    except psutil.TimeoutExpired:
        return None, None, [api, *tree]
    exited = time.monotonic() - since
    deadline = time.monotonic() + max(5.0, since + EXIT_BOUND - time.monotonic())
    while time.monotonic() < deadline and any(alive(p) for p in tree):
        time.sleep(0.2)
    return code, exited, [p for p in tree if alive(p)]


def kill(procs: list[psutil.Process]) -> None:
    """SIGKILL what this test's server left behind (asserted on by the tests)."""
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def probe_health(base: str) -> int | str:
    try:
        return requests.get(base + "/health", timeout=5).status_code
    except requests.ConnectionError:
        return "refused"


def exception_lines(log: str) -> set[str]:
    """The exception types the server logged (a traceback's last line)."""
    return set(re.findall(r"\] ([A-Za-z_][\w.]*(?:Error|Exception)): ", log))


ENGINE_DEAD_ERROR = "vllm.v1.engine.exceptions.EngineDeadError"


def assert_nothing_raised_in_the_fork(log: str) -> None:
    """No exception but upstream's EngineDeadError, no mask hop's error."""
    assert exception_lines(log) <= {ENGINE_DEAD_ERROR}, exception_lines(log)
    for text in ("MissingSamplingMaskError", "SamplingMaskGenerationError",
                 "sampling mask: internal error"):
        assert text not in log


@dataclass
class Fault:
    """What one scenario observed, for its tests to assert."""
    base: str
    log: str = ""
    fault_at: float = 0.0
    clients: dict[str, Client] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    exit_code: int | None = None
    exited_after: float | None = None
    left_alive: list = field(default_factory=list)

    def shutdown_from(self) -> float:
        """Seconds from SIGTERM to where the shutdown starts: at once when aborting;
        draining, once the engine has run the in-flight requests to their end (the last
        answered), which takes as many steps as they had left, a property of the
        release's step time (Model Runner V2 under Triton's interpreter: ~0.3 s)."""
        if "during_drain" not in self.clients:
            return 0.0
        return max(c.waited(self.fault_at) for c in self.clients["in_flight"])

    def summary(self, title: str) -> str:
        """What happened, in figures (printed; `pytest -s` shows it)."""
        lines = [f"{title}: exit code {self.exit_code} after "
                 f"{self.exited_after and round(self.exited_after, 1)} s, left alive "
                 f"{self.left_alive}, {self.extra}"]
        for group, clients in self.clients.items():
            for c in clients:
                outcome = (type(c.exc).__name__ if c.exc else
                           f"HTTP {c.status}" + (f", {len(c.chunks)} chunks, "
                                                 f"{len(c.errors)} error events"
                                                 if c.stream and c.status == 200 else ""))
                lines.append(f"  {group} {c.name}: {outcome}, answered "
                             f"{c.waited(self.fault_at):.2f} s after the fault")
        return "\n".join(lines)


# -- engine core killed mid-request ----------------------------------------------------

@pytest.fixture(scope="module")
def engine_killed(tmp_path_factory):
    """Four requests running (generate plain and streamed, completions streamed,
    chat plain) and two streams still queued behind `--max-num-seqs 4` (generate,
    chat: no event yet, so the fork's `open_stream` is still waiting for their
    first event), then SIGKILL to the engine core."""
    log_path = tmp_path_factory.mktemp("faults") / "engine-killed.log"
    port = free_port()
    extra = ["--max-num-seqs", "4", "--max-model-len", "2048"]
    with serving(port, str(log_path), extra=extra, runner=server_runner(),
                 env=host_env()) as base:
        api = api_server(port)
        tree = api.children(recursive=True)
        core = engine_core(tree)
        run = Fault(base)
        warm_up(base)
        running = [Client(base, "generate", False, 1500),
                   Client(base, "generate", True, 1500),
                   Client(base, "completions", True, 1500),
                   Client(base, "chat", False, 1500)]
        queued = [Client(base, "generate", True, 1500), Client(base, "chat", True, 1500)]
        for c in running:
            c.start()
        in_flight(base, running, running=4)
        for c in queued:
            c.start()
        in_flight(base, running + queued, running=4, waiting=2, queued=tuple(queued))
        run.fault_at = time.monotonic()
        core.send_signal(signal.SIGKILL)
        join_all(running + queued, run.fault_at)
        run.clients = {"running": running, "queued": queued}
        # right after the errors: the server is not healthy, a new request fails fast
        run.extra["health"] = probe_health(base)
        started = time.monotonic()
        try:
            r = requests.post(base + "/inference/v1/generate", timeout=HANG, json=(
                request_for("generate", False, 4)[1]))
            run.extra["new_request"] = r.status_code
        except requests.ConnectionError:
            run.extra["new_request"] = "refused"
        run.extra["new_request_s"] = time.monotonic() - started
        run.exit_code, run.exited_after, run.left_alive = wait_exit(api, tree,
                                                                   run.fault_at)
        kill(run.left_alive)
    run.log = log_path.read_text()
    print(run.summary("engine core SIGKILLed"))
    return run


def test_engine_death_ends_every_request_promptly_with_an_error(engine_killed):
    running, queued = engine_killed.clients["running"], engine_killed.clients["queued"]
    for c in running + queued:
        assert c.exc is None, c.describe()
        assert c.waited(engine_killed.fault_at) < HANG, c.describe()
    for c in running:
        if c.stream:
            # started streams: their chunks so far, masks aligned, then one error event
            assert c.status == 200 and c.chunks, c.describe()
            tokens_and_mask(c)
            assert finish_reason(c) is None
            (error,) = c.errors
            assert error["error"]["code"] == 500 and engine_dead(error["error"]["message"])
            assert c.done and not c.after_error, c.describe()
        else:
            assert c.status == 500, c.describe()
            assert engine_dead(c.json["error"]["message"]), c.describe()
    for c in queued:
        # no event before the engine died: the fork's open_stream answers the first
        # (error) event as an HTTP error instead of a 200 with an error event
        assert c.status == 500, c.describe()
        assert engine_dead(c.json["error"]["message"]), c.describe()


def test_after_engine_death_the_server_refuses_and_exits(engine_killed):
    run = engine_killed
    assert run.extra["health"] != 200
    assert run.extra["new_request"] != 200 and run.extra["new_request_s"] < HANG, run.extra
    assert run.exited_after is not None, "vllm serve still running after engine death"
    # upstream exits "cleanly" (uvicorn's should_exit): a supervisor cannot tell an
    # engine death from a requested stop by the exit code
    assert run.exit_code == 0
    assert not run.left_alive, f"processes left behind: {run.left_alive}"


def test_engine_death_raises_nothing_in_the_fork(engine_killed):
    """The server logs only upstream's EngineDeadError: no mask hop raised on the
    requests the dead engine left unfinished."""
    assert "engine core exited unexpectedly" in engine_killed.log
    assert ENGINE_DEAD_ERROR in exception_lines(engine_killed.log)
    assert_nothing_raised_in_the_fork(engine_killed.log)


# -- SIGTERM to the API server ---------------------------------------------------------

ROUTES = [("generate", False), ("generate", True), ("completions", True),
          ("chat", False), ("chat", True)]


def wait_log(path, text: str, timeout: float = HANG) -> float:
    return wait_until(lambda: text in path.read_text(), timeout, f"{text!r} in the log")


def sigterm_run(tmp_path_factory, shutdown_timeout: int) -> Fault:
    """Five requests in flight on the three routes, then SIGTERM to `vllm serve` run
    with `--shutdown-timeout` 0 (vLLM's default: abort) or more (drain). Draining, a
    new request is sent while the engine drains, and one after it has finished.

    Aborting, the engine core is SIGSTOPped just before: it stands for an engine core
    busy in a step when the signal comes (its SIGTERM handler, and the aborts, run
    only between steps; a GPU step takes tens of ms, the API server SIGKILLs it
    within about one). On this CPU host's short steps the aborts sometimes make it
    out first (a 200 with `finish_reason: "abort"`, the tokens so far and their
    masks) and sometimes not: a race a test cannot pin; stopped, they never do."""
    drain = shutdown_timeout > 0
    log_path = tmp_path_factory.mktemp("faults") / f"sigterm-{shutdown_timeout}.log"
    port = free_port()
    # aborted, an answer comes at once (the engine core never sends it, the fork does);
    # draining, every request runs to its end within the hang bound: fewer tokens on
    # Model Runner V2, which runs under Triton's interpreter on a CPU host (~0.3 s a step)
    drained_tokens = 200 if server_runner() == "v1" else 40
    max_tokens, hang = (drained_tokens, HANG) if drain else (1500, ABORT_HANG)
    extra = ["--max-num-seqs", "8", "--max-model-len", "2048",
             "--shutdown-timeout", str(shutdown_timeout)]
    with serving(port, str(log_path), extra=extra, runner=server_runner(),
                 env=host_env()) as base:
        api = api_server(port)
        tree = api.children(recursive=True)
        run = Fault(base)
        run.extra.update(max_tokens=max_tokens)
        warm_up(base)
        clients = [Client(base, route, stream, max_tokens, timeout=hang)
                   for route, stream in ROUTES]
        for c in clients:
            c.start()
        in_flight(base, clients, running=len(clients))
        run.fault_at = time.monotonic()
        if not drain:
            engine_core(tree).send_signal(signal.SIGSTOP)
        api.send_signal(signal.SIGTERM)
        run.clients = {"in_flight": clients}
        if drain:
            wait_log(log_path, "EngineCore: draining in-flight requests")
            run.extra["health_draining"] = probe_health(base)
            during = Client(base, "generate", False, 4)
            during.start()
            join_all(clients + [during], run.fault_at)
            run.clients["during_drain"] = [during]
            # the engine core has left its busy loop; the API server still listens
            wait_log(log_path, "EngineCore: request processing complete")
            late = Client(base, "generate", False, 4)
            late.start()
            late.join(HANG + 5)
            run.clients["after_drain"] = [late]
            run.extra["after_drain_answered_s"] = (
                late.ended_at and round(late.ended_at - late.started_at, 2))
        else:
            join_all(clients, run.fault_at)
        run.exit_code, run.exited_after, run.left_alive = wait_exit(api, tree,
                                                                   run.fault_at)
        kill(run.left_alive)
    run.log = log_path.read_text()
    print(run.summary(f"SIGTERM, --shutdown-timeout {shutdown_timeout}"))
    return run


@pytest.fixture(scope="module")
def aborted(tmp_path_factory):
    return sigterm_run(tmp_path_factory, 0)


@pytest.fixture(scope="module")
def drained(tmp_path_factory):
    return sigterm_run(tmp_path_factory, 60)


@pytest.fixture(params=["aborted", "drained"])
def terminated(request):
    return request.getfixturevalue(request.param)


def test_sigterm_draining_completes_every_in_flight_request_with_its_masks(drained):
    for c in drained.clients["in_flight"]:
        assert c.exc is None and c.status == 200, c.describe()
        assert c.waited(drained.fault_at) < HANG, c.describe()
        if c.stream:
            assert c.done and not c.errors, c.describe()
        token_ids, _ = tokens_and_mask(c)
        assert finish_reason(c) == "length", c.describe()
        assert len(token_ids) == drained.extra["max_tokens"]


def test_sigterm_aborting_answers_nothing_wrong(aborted):
    """Aborted with the engine core busy: no client gets an error status, an error
    event or a malformed answer. Each gets a 200 with the tokens so far (a stream
    had some before the signal), their masks aligned, and `finish_reason: "abort"`;
    a stream ends with `[DONE]`."""
    for c in aborted.clients["in_flight"]:
        assert c.exc is None and c.status == 200 and not c.errors, c.describe()
        token_ids, _ = tokens_and_mask(c)
        assert 0 < len(token_ids) < aborted.extra["max_tokens"], c.describe()
        assert not c.stream or (c.done and not c.after_error), c.describe()
        if c.stream and c.name == "generate-stream":
            # upstream's generate stream skips a chunk with no new token, so the abort
            # output (no new token unless merged with one not yet sent) may end it
            # with `[DONE]` alone
            assert finish_reason(c) in ("abort", None), c.describe()
        else:
            assert finish_reason(c) == "abort", c.describe()


def test_sigterm_aborting_answers_every_in_flight_request(aborted):
    """Upstream answered none (the engine core was SIGKILLed before sending its
    aborts): the fork answers every one as soon as the engine client has shut down."""
    for c in aborted.clients["in_flight"]:
        assert c.exc is None, c.describe()
        assert c.waited(aborted.fault_at) < ANSWERED, c.describe()


def test_sigterm_stops_the_whole_process_tree_cleanly(terminated):
    assert terminated.exited_after is not None, "vllm serve still running"
    # at once: not after some client gave up (upstream waited for every one)
    assert terminated.exited_after - terminated.shutdown_from() < EXIT_PROMPT, \
        (terminated.exited_after, terminated.shutdown_from())
    answered = [c.ended_at - terminated.fault_at
                for clients in terminated.clients.values() for c in clients]
    assert max(answered) < terminated.exited_after, answered
    assert terminated.exit_code == 0
    assert not terminated.left_alive, f"processes left behind: {terminated.left_alive}"
    assert "[shutdown] API server: engine client stopped" in terminated.log
    # draining, upstream's output handler may log an EngineDeadError at teardown
    assert_nothing_raised_in_the_fork(terminated.log)


def test_a_request_sent_while_draining_is_refused_at_once(drained):
    assert drained.extra["health_draining"] == 200   # upstream: healthy while draining
    (c,) = drained.clients["during_drain"]
    assert c.exc is None and c.status == 200, c.describe()
    assert c.waited(drained.fault_at) < HANG
    assert finish_reason(c) == "abort"
    token_ids, mask = tokens_and_mask(c)
    assert token_ids == [] and len(mask) == 0


def test_a_request_sent_after_the_drain_gets_an_answer(drained):
    """Upstream never answered it: the fork aborts it once the engine client has
    shut down (a 200, "abort", no token), unless upstream has already seen the
    engine core gone (its exit notice reached the output handler, or the request
    came after the shutdown): then it fails with EngineDeadError, a 500. It waits
    for the engine core process to exit (about 4 s here), no longer."""
    (c,) = drained.clients["after_drain"]
    assert c.exc is None, c.describe()
    assert c.ended_at - c.started_at < HANG, c.describe()
    if c.status == 200:
        assert finish_reason(c) == "abort", c.describe()
        token_ids, mask = tokens_and_mask(c)
        assert token_ids == [] and len(mask) == 0
    else:
        assert c.status == 500 and engine_dead(c.json["error"]["message"]), c.describe()
