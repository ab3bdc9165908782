"""The mask's cost per step on the V1 runner: alternating pairs, mask on vs off, one run.

The protocol the step-cost goal is judged by (docs/sampling_mask.md, "Cost"):

- two engines side by side in this process (each engine core in its own process,
  vLLM's default, so every process hop is in the figure), the same model and
  settings, both `--logprobs-mode processed_logprobs`: one with
  `return_sampling_mask=True`, one without;
- per point (model, batch), `--pairs` pairs of the same seeded `LLM.generate` call
  (top_k 50, top_p 0.95); each arm of a pair is as many calls as take about
  `--arm-seconds` (10; the count measured on a warm call of each engine), and the
  arms take turns call by call (off, on, on, off, ...); the pair's ratio is on/off
  throughput (the off arm's time over the on arm's: the same tokens). One call
  per arm (`--arm-seconds 0`, the protocol before 2026-12-02) left a pair's ratio
  to this machine's call-to-call noise: identical calls of one engine vary by
  5-9% here, about as much as a loop of pure arithmetic does;
- reported: the median of the pair ratios and its interquartile range; a point
  whose range is wider than `--max-iqr` (3%) is "inconclusive", else "met" when
  the median reaches `--goal` (0.97), else "not met" (`protocol.py`, which
  `bench_serving.py` judges its rounds by too);
- before each timed call, both engines' processes are let go quiet (`Settle`),
  with their idle polling shortened from 1 s to 0.25 s (`idle_poll.py`): after a
  call vLLM's worker polls its queue for a second on the core both workers are
  bound to, which the other engine's next call otherwise ran beside;
  `--upstream-poll` and `--no-settle` put back each as it was before 2026-12-02;
- the engine cores and this process are bound to the CPUs the workers are not
  (`protocol.pin_beside_workers`): left to the kernel, an engine core sat on its
  worker's core for one engine's whole life and beside it for the other's, and
  whole runs of one point differed by more than each run's range; `--no-pin`
  leaves them as before 2026-12-05; `--on-first` starts the mask-on engine first
  (the engines are otherwise started off, then on), the check that the order the
  engines started in does not make the figure;
- `--unasked`: the mask-on engine's requests say `return_sampling_mask: false`, so
  the ratio is what serving a request that asks for no mask costs on an engine
  started with the flag (a server's "off" arm in `bench_serving.py`);
- one more point per batch on the mask-on engine: requests asking for support
  logprobs vs mask only (the same alternating pairs);
- the machine's load average before and after, and the release;
- where the time goes across the process hops (`--cpu`): per engine step, the CPU
  time of the worker process (the model, the sampler: plan, extraction, the host
  form, pickling the step's output), of the engine-core process (unpickling it,
  the scheduler: checking and slicing per request, encoding) and of the client
  process (decoding, the output processor, `LLM`'s outputs), each arm's mean
  over its calls, and the difference on - off. On this machine the processes
  share two cores (the engine core polls for the worker's output, so its CPU time
  is about the wall time) and torch's threads wait for each other at every
  parallel region, so the client's CPU time costs step time too;
- where the time goes per function (`--timers`, `step_timers.py`): wall time per
  step of upstream's step functions and of each of the overlay's, measured in
  place in each process (the worker, the engine core, the client), off and on.

    python benchmarks/bench_step_cost.py
    python benchmarks/bench_step_cost.py --models demo --batches 32 --pairs 9
    python benchmarks/bench_step_cost.py --models demo --batches 32 --both-off   # the check
    python benchmarks/bench_step_cost.py --models demo --batches 32 --unasked
    python benchmarks/bench_step_cost.py --json benchmarks/results/step_cost/demo-0.32.0.json
    python benchmarks/bench_step_cost.py --models demo --speculative draft_model --goal 0.95
    python benchmarks/bench_step_cost.py --models demo --batches 8 --cpu --no-support
    python benchmarks/bench_step_cost.py --models demo --batches 8 --timers --no-support

`--speculative ngram|draft_model` runs both engines with speculative decoding (3
draft positions; `draft_model` with `demo.perturbed_draft`, a noisy copy of the demo
model) and also reports each engine's acceptance rate over the pairs (the same
seeded calls: they must be equal).

Runs the V1 runner natively: TRITON_INTERPRET and VLLM_USE_V2_MODEL_RUNNER are
removed from the environment before vLLM is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

for _name in ("TRITON_INTERPRET", "VLLM_USE_V2_MODEL_RUNNER"):
    os.environ.pop(_name, None)

HERE = os.path.dirname(os.path.abspath(__file__))
IDLE_POLL_S = 0.25   # the engines' readers poll this long after a read (idle_poll.py)
ARM_SECONDS = 10.0   # each arm of a pair runs about this long of calls
sys.path.insert(0, HERE)
import idle_poll  # noqa: E402
from protocol import GOAL, MAX_IQR, Settle, cpu_seconds, pin_beside_workers, verdict  # noqa: E402
import step_timers  # noqa: E402
from bench_v1_engine import model_path  # noqa: E402


def workload(batch: int, max_tokens: int, extra_args: dict | None = None):
    from vllm import SamplingParams
    prompts = [{"prompt_token_ids": [(7 * i + j) % 4000 + 10 for j in range(16)]}
               for i in range(batch)]
    params = [SamplingParams(temperature=1.0, top_k=50, top_p=0.95, max_tokens=max_tokens,
                             ignore_eos=True, seed=i, detokenize=False,
                             extra_args=dict(extra_args) if extra_args else None)
              for i in range(batch)]
    return prompts, params


def timed(llm, prompts, params, cpu: "CpuProbe | None" = None,
          client_timers: dict | None = None, settle: "Settle | None" = None) -> float:
    if settle is not None:
        settle()
    if cpu is not None:
        cpu.start()
    before = step_timers.totals() if client_timers is not None else None
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    if before is not None:
        for name, entry in step_timers.difference(step_timers.totals(), before).items():
            into = client_timers.setdefault(name, [0.0, 0.0, 0])
            for i in range(3):
                into[i] += entry[i]
    if cpu is not None:
        cpu.stop()
    assert all(len(o.outputs[0].token_ids) == params[0].max_tokens for o in outs)
    return elapsed


class CpuProbe:
    """CPU seconds of one engine's processes per timed call: its engine-core
    process, the worker processes that process started (vLLM 0.32's CPU build
    runs even one worker in a process of its own), and this, the client,
    process."""

    def __init__(self, engine_processes) -> None:
        self.engine = list(engine_processes)
        self.samples: dict[str, list[float]] = {"worker": [], "engine core": [],
                                                "client": []}

    def _cpu(self) -> tuple[float, float]:
        core = sum(cpu_seconds(proc) for proc in self.engine)
        workers = sum(cpu_seconds(child) for proc in self.engine
                      for child in proc.children(recursive=True))
        return workers, core

    def start(self) -> None:
        self._t0 = (*self._cpu(), time.process_time())

    def stop(self) -> None:
        now = (*self._cpu(), time.process_time())
        for name, a, b in zip(self.samples, self._t0, now):
            self.samples[name].append(b - a)


def new_engine(**kwargs):
    """An `LLM` and the processes it started (its engine core)."""
    import psutil
    from vllm import LLM
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    llm = LLM(**kwargs)
    started = [p for p in me.children() if p.pid not in before]
    return llm, started


def cpu_per_step(off: CpuProbe, on: CpuProbe, steps: int) -> dict:
    """Each process's CPU microseconds per engine step, off and on: the mean over
    the calls (the kernel counts CPU time in ticks of 10 ms, a few per call)."""
    report = {}
    for name in off.samples:
        a = statistics.fmean(off.samples[name]) / steps * 1e6
        b = statistics.fmean(on.samples[name]) / steps * 1e6
        report[name] = {"off_us": a, "on_us": b, "added_us": b - a}
    return report


def pairs(first, second, n: int, calls: int = 1,
          times: tuple[list, list] | None = None) -> list[float]:
    """`n` pairs of two arms of `calls` timed calls each, the arms taking turns call
    by call (first, second, second, first, ...: each pair starts with the arm the
    one before ended with); each pair's second-over-first throughput ratio (the
    first arm's total time over the second's). `times`: two lists that get each
    arm's call times."""
    ratios = []
    turn = 0
    for _ in range(n):
        a = b = 0.0
        for _ in range(calls):
            if turn % 2 == 0:
                x, y = first(), second()
            else:
                y, x = second(), first()
            a, b, turn = a + x, b + y, turn + 1
            if times is not None:
                times[0].append(x)
                times[1].append(y)
        ratios.append(a / b)
    return ratios


def spread(times: list[float]) -> dict:
    """One arm's call times: their coefficient of variation (the machine's
    call-to-call noise: the calls are identical), and the times."""
    return {"cv": statistics.pstdev(times) / statistics.fmean(times), "seconds": times}


def speculative_config(method: str | None, model: str, workdir: str) -> dict | None:
    if method is None:
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                "prompt_lookup_min": 1}
    from vllm_sampling_mask import DEMO_MODEL
    from vllm_sampling_mask.tools.demo import perturbed_draft
    if model != DEMO_MODEL:
        raise SystemExit("--speculative draft_model: the draft is a copy of the demo model "
                         "(--models demo)")
    return {"method": "draft_model", "num_speculative_tokens": 3,
            "model": perturbed_draft(os.path.join(workdir, "draft"))}


def acceptance(llm) -> tuple[float, float]:
    """(accepted, drafted) draft tokens so far."""
    found = {m.name: m for m in llm.get_metrics()}
    return (found["vllm:spec_decode_num_accepted_tokens"].value,
            found["vllm:spec_decode_num_draft_tokens"].value)


def engine_pids(processes) -> list[int]:
    """An engine's engine-core processes and the worker processes they started."""
    return [pid for proc in processes
            for pid in [proc.pid] + [c.pid for c in proc.children(recursive=True)]]


def timers_per_step(folder: str, procs: dict, before: dict, client: dict) -> dict:
    """process -> function -> wall microseconds per step, off, on and added."""
    after = {arm: step_timers.collect(engine_pids(procs[arm]), folder) for arm in procs}
    engine = {arm: step_timers.difference(after[arm], before[arm]) for arm in procs}
    report = {role: step_timers.per_step(engine["off"], engine["on"], role)
              for role in ("worker", "engine core")}
    report["client"] = step_timers.per_step(client["off"], client["on"], "client")
    return report


def measure(model: str, batches: list[int], n_pairs: int, max_tokens: int, goal: float,
            max_iqr: float, support: bool = True, both_off: bool = False,
            speculative: dict | None = None, cpu: bool = False,
            timers: str | None = None, settle: bool = True,
            arm_seconds: float = ARM_SECONDS, pin: bool = True,
            on_first: bool = False, unasked: bool = False) -> list[dict]:
    common = dict(model=model, dtype="float32", max_model_len=512, enforce_eager=True,
                  seed=0, logprobs_mode="processed_logprobs",
                  kv_cache_memory_bytes=1 << 30, max_num_seqs=max(batches),
                  skip_tokenizer_init=True)
    if speculative is not None:
        common.update(speculative_config=speculative, disable_log_stats=False)
    # `both_off`: the protocol's own check, the second engine with the mask off too
    arms = {"off": {}, "on": {} if both_off else {"return_sampling_mask": True}}
    started = {arm: new_engine(**common, **arms[arm])
               for arm in (("on", "off") if on_first else ("off", "on"))}
    (off, off_procs), (on, on_procs) = started["off"], started["on"]
    pinned = pin_beside_workers(off_procs + on_procs) if pin else None
    rows = []
    for batch in batches:
        quiet = Settle(off_procs + on_procs) if settle else None
        prompts, params = workload(batch, max_tokens)
        # `unasked`: the mask engine serves requests that say return_sampling_mask false
        on_params = workload(batch, max_tokens, {"return_sampling_mask": False})[1] \
            if unasked else params
        _, with_logprobs = workload(batch, max_tokens,
                                    {"return_sampling_mask_logprobs": True})
        for llm in (off, on):                     # warm-up at this batch size
            llm.generate(prompts, params, use_tqdm=False)
        call_s = statistics.fmean(timed(llm, prompts, params, settle=quiet) for llm in (off, on))
        calls = max(1, round(arm_seconds / call_s))
        outs = on.generate(prompts[:1], on_params[:1], use_tqdm=False)
        assert (outs[0].outputs[0].sampling_mask is None) == (both_off or unasked)
        before = [acceptance(llm) for llm in (off, on)] if speculative else None
        probes = (CpuProbe(off_procs), CpuProbe(on_procs)) if cpu else (None, None)
        client = {"off": {}, "on": {}} if timers else {"off": None, "on": None}
        procs = {"off": off_procs, "on": on_procs}
        if timers:
            before = {arm: step_timers.collect(engine_pids(procs[arm]), timers)
                      for arm in procs}
        times = ([], [])
        mask = pairs(lambda: timed(off, prompts, params, probes[0], client["off"], quiet),
                     lambda: timed(on, prompts, on_params, probes[1], client["on"], quiet),
                     n_pairs, calls, times)
        row = {"batch": batch, "calls_per_arm": calls, "pinned_to": pinned,
               "started_first": "on" if on_first else "off", "unasked": unasked,
               "mask_on_vs_off": verdict(mask, goal, max_iqr),
               "calls": {"off": spread(times[0]), "on": spread(times[1])}}
        if cpu:   # the prefill gives the first token, each further step one more
            row["cpu_per_step"] = cpu_per_step(*probes, max_tokens)
        if timers:
            row["timers_per_step"] = timers_per_step(timers, procs, before, client)
        if speculative:
            for name, llm, (accepted, drafted) in zip(("off", "on"), (off, on), before):
                now = acceptance(llm)
                row[f"acceptance_{name}"] = (now[0] - accepted) / max(now[1] - drafted, 1)
        if support and not (both_off or unasked):
            row["support_logprobs_vs_mask_only"] = verdict(
                pairs(lambda: timed(on, prompts, params, settle=quiet),
                      lambda: timed(on, prompts, with_logprobs, settle=quiet), n_pairs,
                      calls),
                goal, max_iqr)
        if quiet is not None:
            row["settle"] = quiet.report()
        rows.append(row)
        print(json.dumps({"batch": batch, **{k: {x: v[x] for x in ("median", "iqr", "status")}
                                              if isinstance(v, dict) and "median" in v else v
                                              for k, v in row.items() if k != "batch"}}),
              flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["demo", "vocab151936"])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--pairs", type=int, default=9)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--goal", type=float, default=GOAL)
    ap.add_argument("--max-iqr", type=float, default=MAX_IQR)
    ap.add_argument("--no-support", action="store_true",
                    help="skip the support-logprobs vs mask-only pairs")
    ap.add_argument("--both-off", action="store_true",
                    help="the protocol's check: both engines with the mask off (the "
                         "ratio the order alone gives)")
    ap.add_argument("--unasked", action="store_true",
                    help="the mask engine's requests say return_sampling_mask false: what "
                         "a request that asks for no mask costs on an engine started "
                         "with the flag (no support-logprobs pairs)")
    ap.add_argument("--speculative", choices=["ngram", "draft_model"], default=None,
                    help="both engines with speculative decoding (3 draft positions)")
    ap.add_argument("--cpu", action="store_true",
                    help="also each process's CPU time per step, off and on")
    ap.add_argument("--timers", action="store_true",
                    help="also where the step's time goes: per function, wall time per "
                         "step in each process, off and on (step_timers.py)")
    ap.add_argument("--arm-seconds", type=float, default=ARM_SECONDS,
                    help="each arm of a pair runs as many calls as take about this "
                         "long (at least one), the arms taking turns call by call; "
                         "0: one call per arm (the protocol before 2026-12-02)")
    ap.add_argument("--upstream-poll", action="store_true",
                    help="leave the engines' idle polling as upstream has it (1 s "
                         "after a call; idle_poll.py says why the bench shortens it)")
    ap.add_argument("--no-settle", action="store_true",
                    help="start each timed call at once, without waiting for the other "
                         "engine's worker to stop polling (the protocol before "
                         "2026-12-02; Settle says why it waits)")
    ap.add_argument("--no-pin", action="store_true",
                    help="leave the engine cores and this process where the kernel puts "
                         "them (the protocol before 2026-12-05, later; "
                         "protocol.pin_beside_workers says why it binds them)")
    ap.add_argument("--on-first", action="store_true",
                    help="start the mask-on engine first (a check that the engines' "
                         "start order does not make the figure)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    if args.pairs < 4:
        ap.error("--pairs must be at least 4 for quartiles (the protocol says 9)")

    import vllm
    report = {"vllm": vllm.__version__, "cpus": os.cpu_count(),
              "load_before": os.getloadavg(), "pairs": args.pairs,
              "max_tokens": args.max_tokens, "goal": args.goal, "max_iqr": args.max_iqr,
              "speculative": args.speculative, "settle": not args.no_settle,
              "arm_seconds": args.arm_seconds,
              "idle_poll_s": None if args.upstream_poll else IDLE_POLL_S, "models": {}}
    workdir = tempfile.mkdtemp(prefix="bench_step_cost_")
    # every process the engines start loads engine_site: the timers, the idle poll
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(HERE, "engine_site")]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    if not args.upstream_poll:
        os.environ[idle_poll.ENV] = str(IDLE_POLL_S)
    timers = None
    if args.timers:
        timers = os.path.join(workdir, "timers")
        os.makedirs(timers)
        os.environ[step_timers.ENV] = timers
        step_timers.install()
    for name in args.models:
        path = model_path(name)
        print(f"== {name} (vLLM {vllm.__version__})", flush=True)
        report["models"][name] = measure(
            path, args.batches, args.pairs, args.max_tokens, args.goal, args.max_iqr,
            not args.no_support, args.both_off,
            speculative_config(args.speculative, path, workdir), args.cpu, timers,
            not args.no_settle, args.arm_seconds, not args.no_pin, args.on_first,
            args.unasked)
    report["load_after"] = os.getloadavg()
    print(f"\nV1 runner, vLLM {vllm.__version__}, {args.max_tokens} tokens, top_k 50, "
          f"top_p 0.95, speculative decoding {args.speculative or 'off'}, "
          f"{args.pairs} alternating pairs per point, each arm about "
          f"{args.arm_seconds:g} s of calls; load "
          f"{report['load_before'][0]:.2f} before, {report['load_after'][0]:.2f} after")
    print(f"{'model':>12} {'batch':>5} | {'on/off median [IQR]':>26} {'':>12} | "
          f"{'logprobs/mask-only [IQR]':>26} {'':>12}")
    for name, rows in report["models"].items():
        for row in rows:
            cells = []
            for key in ("mask_on_vs_off", "support_logprobs_vs_mask_only"):
                if key not in row:
                    cells.append("not measured")
                    continue
                v = row[key]
                cells.append(f"{v['median']:.3f} [{v['q1']:.3f}, {v['q3']:.3f}]"
                             f" {v['status']:>12}")
            accepted = (f" | acceptance off {row['acceptance_off']:.3f}, on "
                        f"{row['acceptance_on']:.3f}" if "acceptance_on" in row else "")
            print(f"{name:>12} {row['batch']:>5} | {cells[0]:>39} | {cells[1]:>39}{accepted}")
            print(f"{'':>12} {'':>5}   engine cores and client bound to CPUs "
                  f"{row['pinned_to']}" if row.get("pinned_to") else
                  f"{'':>12} {'':>5}   engine cores and client not bound")
            print(f"{'':>12} {'':>5}   {row['calls_per_arm']} calls per arm; identical "
                  f"calls varied by {row['calls']['off']['cv']:.1%} (off) and "
                  f"{row['calls']['on']['cv']:.1%} (on), coefficient of variation")
            if "settle" in row:
                w = row["settle"]
                print(f"{'':>12} {'':>5}   waited for quiet before each of {w['calls']} "
                      f"calls: median {w['median_wait_s']:.2f} s, longest "
                      f"{w['max_wait_s']:.2f} s, {w['timeouts']} reached the limit")
            for process, cpu in row.get("cpu_per_step", {}).items():
                print(f"{'':>12} {'':>5}   CPU per step, {process}: off {cpu['off_us']:.0f} us, "
                      f"on {cpu['on_us']:.0f} us, added {cpu['added_us']:+.0f} us")
            for process, functions in row.get("timers_per_step", {}).items():
                for function, t in functions.items():
                    print(f"{'':>12} {'':>5}   {process:>11} {function:<34} off "
                          f"{t['off_us']:8.0f} us  on {t['on_us']:8.0f} us  "
                          f"added {t['added_us']:+7.0f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
