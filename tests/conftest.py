"""Shared set-up: the demo model, MRv2 on CPU, and an independent reference.

The environment is set before anything imports vLLM, so every engine the tests
start (and every process it spawns) runs Model Runner V2, on a CPU host through
Triton's interpreter.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket

import torch

os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# lets tests probe the worker process with `LLM.collective_rpc(function)`
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
# engines and Ray clusters on loopback (vLLM and Ray pick the host's interface address
# otherwise; tests/ray_head.py)
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _share_the_cores() -> None:
    """Under pytest-xdist (pyproject's `-n auto`: one worker per core, two at most),
    each worker's engines run their OpenMP threads on that worker's own cores, and
    its own torch on one thread: vLLM's automatic binding would put every engine on
    the same core. A binding set outside is kept. A worker that replaces a crashed
    one gets the next id (gw2, gw3, ...): it takes the cores of the slot it fills
    (its id modulo the count), so a crash costs that worker's unit of work, not the run."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), \
        int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0))
    if not worker or count < 2 or len(cores) < count or torch.cuda.is_available():
        return
    mine = cores[int(worker.removeprefix("gw")) % count::count]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, mine)))
    torch.set_num_threads(len(mine))


_share_the_cores()

import pytest  # noqa: E402

from vllm_sampling_mask import DEMO_MODEL  # noqa: E402
from vllm_sampling_mask.tools.demo import DEMO_PROMPTS  # noqa: E402

# What every mask-engine test uses: exactness needs float32 (bfloat16, vLLM's CPU
# default for a float32 checkpoint, makes ties common).
ENGINE_KWARGS = dict(
    model=DEMO_MODEL, dtype="float32", max_model_len=512, enforce_eager=True,
    seed=0, return_sampling_mask=True, logprobs_mode="processed_logprobs")


PROMPTS = DEMO_PROMPTS


def free_port() -> int:
    """A free TCP port on the loopback interface, for a test's own server; within
    `VLLM_SAMPLING_MASK_TEST_PORTS` ("first-last") when set (a host shared with
    other jobs that keep to other ranges)."""
    span = os.environ.get("VLLM_SAMPLING_MASK_TEST_PORTS")
    if span:
        first, last = (int(p) for p in span.split("-"))
        for port in random.sample(range(first, last + 1), last + 1 - first):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
        raise RuntimeError(f"no free port in VLLM_SAMPLING_MASK_TEST_PORTS={span}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def v1_runner() -> bool:
    """Whether the installed release has vLLM's V1 model runner (0.34 removed it and
    refuses VLLM_USE_V2_MODEL_RUNNER=0): the profile's `v1_runner`."""
    from vllm_sampling_mask.patches.apply import upstream_release
    return upstream_release().v1_runner


def skip_without_v1_runner() -> None:
    """Skips the calling test where the release has no V1 model runner."""
    if not v1_runner():
        from vllm_sampling_mask.patches.apply import upstream_release
        pytest.skip(f"vLLM {upstream_release().version} has no V1 model runner "
                    "(Release.v1_runner): this test is of the V1 runner")


def host_env() -> dict[str, str]:
    """What every engine and server needs on this host beside its runner's settings:
    on a host from vLLM's CUDA wheel (Release.cpu_host "cuda-wheel": 0.33, 0.34),
    TRITON_INTERPRET=1, under which the `cpu_op_*` enablers give the CPU kernels the
    wheel lacks, on the V1 runner too."""
    from vllm_sampling_mask.patches.apply import upstream_release
    if upstream_release().cpu_host == "cuda-wheel":
        return {"TRITON_INTERPRET": "1"}
    return {}


@contextlib.contextmanager
def native_v1():
    """Engines built inside this block run vLLM's V1 runner natively: the processes
    they spawn see neither TRITON_INTERPRET (but where `host_env` needs it) nor
    VLLM_USE_V2_MODEL_RUNNER=1. Where the release has no V1 runner the test calling it
    is skipped."""
    skip_without_v1_runner()
    saved = {k: os.environ.get(k) for k in ("TRITON_INTERPRET", "VLLM_USE_V2_MODEL_RUNNER")}
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.update(host_env())
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def server_runner() -> str:
    """The runner the tests' servers use: "v1" natively, "mrv2" where the release has
    no V1 runner."""
    return "v1" if v1_runner() else "mrv2"


def engine_on(runner: str, **kwargs):
    """An `LLM` on `runner`: "v1" natively (`native_v1`), "mrv2" as this session
    sets it up (Model Runner V2, through Triton's interpreter on a CPU host); its
    `runner` attribute says which."""
    from vllm import LLM
    with native_v1() if runner == "v1" else contextlib.nullcontext():
        engine = LLM(**kwargs)
    engine.runner = runner
    return engine


def counter(llm, name: str) -> float:
    """The total so far of one of `llm`'s counters (`vllm:num_preemptions`,
    `vllm:prefix_cache_hits`, ...), summed over its labels."""
    return sum(m.value for m in llm.get_metrics() if m.name == name and hasattr(m, "value"))


def check_alignment(completion, vocab_size):
    """One mask per token, sampled token inside, ids unique, sorted, in range."""
    from vllm_sampling_mask import SamplingMask
    mask = completion.sampling_mask
    assert isinstance(mask, SamplingMask)
    assert len(mask) == len(completion.token_ids)
    for token, support in zip(completion.token_ids, mask.token_ids):
        assert len(support) >= 1
        assert token in support
        assert support == sorted(set(support))
        assert 0 <= support[0] and support[-1] < vocab_size
    return mask


def assert_supports_match_reference(outs, cases, model) -> int:
    """Every returned support against `reference_support` of `model`'s float32
    logits: ids surely in are in, ids surely out are out; ids within eps of a
    threshold go either way and must stay rare. Returns the tokens compared."""
    compared = ambiguous = 0
    for out, case in zip(outs, cases):
        c = out.outputs[0]
        logits = hf_logits(model, out.prompt_token_ids, c.token_ids)
        for t, support in enumerate(c.sampling_mask.token_ids):
            surely_in, surely_out = reference_support(
                logits[t], case["temperature"], case["top_k"],
                case.get("top_p", 1.0), case.get("min_p", 0.0))
            got = set(support)
            assert surely_in <= got, (t, sorted(surely_in - got))
            assert not (got & surely_out), (t, sorted(got & surely_out))
            ambiguous += len(logits[t]) - len(surely_in) - len(surely_out)
            compared += 1
    assert compared == sum(len(o.outputs[0].token_ids) for o in outs)
    assert ambiguous <= compared // 10   # threshold cases are rare, not the rule
    return compared


GEN, CMPL, CHAT = "/inference/v1/generate", "/v1/completions", "/v1/chat/completions"


def route_body(route, sampling=(), *, completion_prompt="def f", **top):
    """The route's smallest valid body, with `sampling` fields where the route takes
    them (generate: inside `sampling_params`) and `top` fields at the top level (a
    value of `...` removes the field); `completion_prompt` is the completions route's
    prompt (a top-level `prompt` field replaces it)."""
    if route == GEN:
        b = {"model": DEMO_MODEL, "token_ids": [5, 6, 7],
             "sampling_params": {"temperature": 1.0, "max_tokens": 2, **dict(sampling)}}
    else:
        b = {"model": DEMO_MODEL, "temperature": 1.0, "max_tokens": 2, **dict(sampling)}
        if route == CMPL:
            b["prompt"] = completion_prompt
        else:
            b["messages"] = [{"role": "user", "content": "hi"}]
    for key, value in top.items():
        if value is ...:
            b.pop(key, None)
        else:
            b[key] = value
    return b


def unique_keys(pairs: list) -> dict:
    """`json.loads`' `object_pairs_hook`: a JSON object's members as a dict; a key
    written twice fails the test (a parser keeps the last, which hides the first)."""
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), f"a key written twice: {keys}"
    return dict(pairs)


# The shared server's limits: a small --max-sampling-mask-size so that tests can
# trip it, and room for a few concurrent sequences.
SERVER_MAX_MASK_SIZE = 128
SERVER_MAX_NUM_SEQS = 8


@pytest.fixture(scope="module")
def before(mask_server):
    """For the modules that send the shared server bad calls: its answer to one seeded
    masked request before any of them (`rl_route_checks.serves_as_before` compares)."""
    from rl_route_checks import seeded_run
    return seeded_run(mask_server)


@pytest.fixture(scope="session")
def mask_server_log(tmp_path_factory):
    return tmp_path_factory.mktemp("serve") / "vllm-serve.log"


@pytest.fixture(scope="session")
def mask_server(mask_server_log):
    """One real `vllm serve` (the stock CLI, patched by the site hook) on the V1
    runner natively (on Model Runner V2 where the release has no V1 runner), shared
    by every HTTP test module: its base URL. Its state
    route (`VLLM_SAMPLING_MASK_DEBUG_STATE=1`) lets tests check that no
    per-request state is left behind; vLLM's RL routes (`/pause`, `/resume`,
    `VLLM_SERVER_DEV_MODE=1`) serve tests/server/test_rl_loop.py, which resumes it after
    each test."""
    from vllm_sampling_mask.tools.demo import serving
    extra = ["--max-num-seqs", str(SERVER_MAX_NUM_SEQS),
             "--max-sampling-mask-size", str(SERVER_MAX_MASK_SIZE),
             # the README's short name (its snippets run against this server) and the path
             "--served-model-name", "demo", DEMO_MODEL]
    with serving(free_port(), str(mask_server_log), extra=extra, runner=server_runner(),
                 env={"VLLM_SAMPLING_MASK_DEBUG_STATE": "1",
                      "VLLM_SERVER_DEV_MODE": "1", **host_env()}) as base:
        yield base


# Stock vLLM in one fresh interpreter with the overlay off
# (`VLLM_SAMPLING_MASK_DISABLE=1`), run once per test run and shared by the workers,
# since each fresh import of vLLM costs ~15 s of CPU here: first what stock vLLM is
# before anything patches it (test_overlay's opt-out), then which modules `vllm
# serve`'s command module imports (test_releases' app module), then every patch
# applied by hand, recording which patch wraps which upstream function in order
# (test_registry's stacked wrappers). The order matters: applying the patches
# imports their targets, the app module among them.
_STOCK_PROBE = """
import json, sys
from vllm import EngineArgs
import vllm.v1.engine.core_client as cc
from vllm_sampling_mask.patches import apply as patching

facts = {"applied": list(patching.APPLIED), "wrapt_imported": "wrapt" in sys.modules,
         "engine_core_outputs": cc.EngineCoreOutputs.__name__, "own_argument": None}
try:   # the overlay's own engine argument (vLLM 0.32 has return_sampling_mask)
    EngineArgs(model="m", max_sampling_mask_size=8)
except TypeError as e:
    facts["own_argument"] = str(e)

import vllm.entrypoints.cli.serve
facts["serve_imports"] = sorted(m for m in sys.modules if m.startswith("vllm."))
# whether stock vLLM counts Triton as present on this host (test_overlay's plain import)
from vllm.triton_utils import HAS_TRITON
facts["has_triton"] = HAS_TRITON

import wrapt
wraps, real = [], wrapt.wrap_function_wrapper

def recording(module, name, wrapper):
    frame, patch = sys._getframe(1), None
    while frame is not None and patch is None:
        mod = frame.f_globals.get("__name__", "")
        if mod.startswith("vllm_sampling_mask.patches.") and mod.count(".") == 4:
            patch = mod.rsplit(".", 1)[1]
        frame = frame.f_back
    owner = module if isinstance(module, str) else module.__name__
    wraps.append([patch, owner + ":" + name])
    return real(module, name, wrapper)

wrapt.wrap_function_wrapper = recording
patching.apply_all()
facts["wraps"] = wraps
print(json.dumps(facts))
"""


@pytest.fixture(scope="session")
def stock_vllm(tmp_path_factory) -> dict:
    """`_STOCK_PROBE`'s facts. Under xdist the first worker to ask runs it and the
    others wait on its lock and read its file (in the run's own temporary folder)."""
    import json
    import subprocess
    import sys
    import textwrap

    from filelock import FileLock
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent     # this run's folder, above each worker's own
    path = shared / "stock_vllm.json"
    with FileLock(str(path) + ".lock"):
        if not path.is_file():
            env = dict(os.environ, VLLM_SAMPLING_MASK_DISABLE="1")
            r = subprocess.run([sys.executable, "-c", textwrap.dedent(_STOCK_PROBE)],
                               env=env, capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, r.stderr[-3000:]
            path.write_text(r.stdout.strip().splitlines()[-1])
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(DEMO_MODEL)


@pytest.fixture(scope="session")
def hf_model():
    """The demo model in transformers, float32: an independent logits source."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, torch_dtype=torch.float32)
    return model.eval()


def hf_logits(hf_model, prompt_ids, token_ids) -> torch.Tensor:
    """Float32 logits [T, V] at the positions that produced `token_ids`."""
    seq = torch.tensor([list(prompt_ids) + list(token_ids)])
    with torch.no_grad():
        logits = hf_model(input_ids=seq).logits[0].float()
    p = len(prompt_ids)
    return logits[p - 1: p - 1 + len(token_ids)]


def reference_support(logits_row: torch.Tensor, temperature: float, top_k: int,
                      top_p: float = 1.0, min_p: float = 0.0, eps: float = 1e-5):
    """(surely_in, surely_out) id sets of the processed distribution.

    Written from the definitions, in MRv2's order: temperature, min-p, top-k
    (ties with the k-th value kept), top-p (drop the least likely ids whose
    cumulative probability stays <= 1 - p; the most likely id always stays).
    Ids within `eps` of a threshold are in neither set: across two float32
    implementations their side of the cut is not defined.
    """
    x = logits_row.double() / temperature
    keep = torch.ones_like(x, dtype=torch.bool)
    near = torch.zeros_like(keep)
    if min_p > 0:
        probs = torch.softmax(x, -1)
        cut = min_p * probs.max()
        keep &= probs >= cut
        near |= (probs - cut).abs() < eps * probs.max()
    if top_k > 0:
        masked = x.masked_fill(~keep, float("-inf"))
        top = masked.topk(min(top_k + 1, int(keep.sum()))).values
        kth = top[min(top_k, len(top)) - 1]
        if len(top) > top_k and top[top_k - 1] - top[top_k] < eps:
            near |= keep & ((x - kth).abs() < eps)   # the k-th cut is a near-tie
        keep &= x >= kth
    if top_p < 1.0:
        masked = x.masked_fill(~keep, float("-inf"))
        probs = torch.softmax(masked, -1)
        order = probs.argsort()
        cum = probs[order].cumsum(0)
        drop_sorted = cum <= 1 - top_p
        drop_sorted[-1] = False
        drop = torch.zeros_like(keep)
        drop[order] = drop_sorted
        close = torch.zeros_like(keep)
        close[order] = (cum - (1 - top_p)).abs() < eps
        near |= keep & close
        keep &= ~drop
    surely_in = set(torch.nonzero(keep & ~near).view(-1).tolist())
    surely_out = set(torch.nonzero(~keep & ~near).view(-1).tolist())
    return surely_in, surely_out


# The release tier: what CI runs on every supported release but the newest (which
# runs the whole suite), `python -m pytest -m release_tier`. The seam contract and
# the release's profile, every patch applied to the release's own modules, the
# upstream fixes that differ per release, and an end-to-end slice: a V1 engine's
# masks against the independent reference, the shared server's three routes
# streamed and not with the switch, a 400, support logprobs and packed masks, the
# generate route's n > 1 without masks, and Model Runner V2 under the interpreter.
# A test is in the tier by its marker (`pytestmark = pytest.mark.release_tier` in
# its module, or `@pytest.mark.release_tier` on it); the tier's tests of one
# parameter are named here, as node-id patterns (fnmatch): each must select a
# test, or the tier run stops.
RELEASE_TIER = (
    'tests/llm/test_engine.py::*[[]v1[]]',
    'tests/llm/test_engine.py::test_supports_match_an_independent_reference[[]mrv2[]]',
    'tests/http/test_server_without_masks.py::test_n_choices_come_back_streamed_or_not[[]asked-off-*',
    'tests/llm/test_speculative.py::*[[]v1-draft_model[]]',
    'tests/llm/test_speculative.py::test_every_emitted_token_has_the_target_support_at_its_position[[]mrv2-draft_model[]]',
    'tests/llm/test_fix_collective_rpc_refusals_sync.py::*[[]v1*',
)


def _mark_release_tier(config, items) -> None:
    import fnmatch

    unmatched = set(RELEASE_TIER)
    for item in items:
        hits = {p for p in RELEASE_TIER if fnmatch.fnmatchcase(item.nodeid, p)}
        if hits:
            item.add_marker(pytest.mark.release_tier)
            unmatched -= hits
    # a module skipped as a whole on this release (it concerns others) collects nothing;
    # a pattern naming a file that does not exist is still an error
    collected = {item.nodeid.split("::")[0] for item in items}
    unmatched = {p for p in unmatched if p.split("::")[0] in collected
                 or not (config.rootpath / p.split("::")[0]).exists()}
    if unmatched and "release_tier" in (config.option.markexpr or "") and \
            not config.option.keyword and not config.args[1:]:
        raise pytest.UsageError(f"RELEASE_TIER patterns that select no test: "
                                f"{sorted(unmatched)}")


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core, at most two (each worker starts its own
    engines; more would trade memory for little)."""
    return max(1, min(2, len(os.sched_getaffinity(0))))


# How pyproject's `-n auto --dist loadscope` shares the suite between the workers.
# A unit of work runs on one worker, so its module-scoped engines start once there:
# - a module is a unit, with two exceptions;
# - the modules that use the shared `mask_server` are one unit, so that one worker
#   starts that server rather than each (a start is ~45 s of CPU on a 2-core host, in
#   every release tier); a module names the fixture in its source to use it
#   (`_check_mask_server_modules`; some take it with `request.getfixturevalue`);
# - a module in ENGINE_UNIT_MODULES is one unit per parameter of its engine fixture
#   (runner, method), so that the two workers start its engines side by side.
# The workers take the heaviest unit left first (tests/unit_seconds.json), so that
# neither is left alone at the end with an engine to start.
MASK_SERVER_MODULES = frozenset((
    "tests/http/test_bad_input.py", "tests/server/test_distributed.py",
    "tests/docs/test_examples.py", "tests/http/test_refusals_name_the_parameter.py",
    "tests/patches/fixes/test_fix_refusal_log.py",
    "tests/patches/fixes/test_fix_token_id_validation.py",
    "tests/patches/fixes/test_fix_abort_request_ids.py",
    "tests/patches/fixes/test_fix_rpc_refusal_log.py",
    "tests/patches/fixes/test_fix_rpc_route_body.py",
    "tests/patches/fixes/test_fix_collective_rpc_refusals.py",
    "tests/http/test_top_k_at_the_vocabulary.py",
    "tests/http/test_models_dtype.py",
    "tests/http/test_requests_without_a_mask_over_http.py",
    "tests/http/test_fuzz.py", "tests/http/test_openai_routes.py",
    "tests/http/test_packed_format.py", "tests/tools/test_replay_check.py",
    "tests/server/test_rl_loop.py", "tests/http/test_rl_route_bodies.py",
    "tests/http/test_generate_route.py", "tests/http/test_server_without_masks.py",
    "tests/server/test_soak.py", "tests/http/test_support_logprobs_over_http.py"))

# Their engine fixture is module-scoped and parametrized, and their tests take no
# other parameter (`_check_engine_units`): a test id's brackets name its engine.
ENGINE_UNIT_MODULES = frozenset((
    "tests/llm/test_engine.py", "tests/llm/test_lora.py",
    "tests/llm/test_speculative.py", "tests/llm/test_speculative_eagle.py",
    "tests/server/test_weight_update.py"))

# Seconds each unit took (setup, call and teardown of its tests) in one measured run
# (its `measured` field says which); `python -m pytest --unit-seconds
# tests/unit_seconds.json` rewrites the units a run reaches. Only the order of the
# queue depends on it: a unit it lacks counts a tenth of a second per test.
UNIT_SECONDS_FILE = os.path.join(os.path.dirname(__file__), "unit_seconds.json")


def work_unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path in MASK_SERVER_MODULES:
        return "mask_server"
    if path in ENGINE_UNIT_MODULES and nodeid.endswith("]"):
        return path + nodeid[nodeid.index("["):]
    return path


def _unit_seconds(path: str = UNIT_SECONDS_FILE) -> dict[str, float]:
    import json
    try:
        with open(path) as f:
            return json.load(f)["seconds"]
    except FileNotFoundError:
        return {}


def _check_mask_server_modules(config, items) -> None:
    paths = {item.nodeid.split("::")[0] for item in items}
    users = {p for p in paths if "mask_server" in (config.rootpath / p).read_text()}
    if users - MASK_SERVER_MODULES:
        raise pytest.UsageError("tests/conftest.py MASK_SERVER_MODULES lacks modules that "
                                f"use mask_server: {sorted(users - MASK_SERVER_MODULES)}")


def _check_engine_units(items) -> None:
    for item in items:
        if item.nodeid.split("::")[0] not in ENGINE_UNIT_MODULES or \
                not hasattr(item, "callspec"):
            continue
        defs = item._fixtureinfo.name2fixturedefs
        other = [name for name in item.callspec.params
                 if name not in defs or defs[name][-1].scope != "module"]
        if other:
            raise pytest.UsageError(
                f"{item.nodeid} takes parameters {other} besides its module's engine: "
                "take its module out of tests/conftest.py ENGINE_UNIT_MODULES, or the "
                "parameters out of the test")


def pytest_xdist_make_scheduler(config, log):
    """loadscope with `work_unit`'s units, the heaviest left taken first."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    seconds = _unit_seconds()

    class HeaviestFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            heaviest = max(self.workqueue, key=lambda unit: seconds.get(
                unit, 0.1 * len(self.workqueue[unit])))
            self.workqueue.move_to_end(heaviest, last=False)
            super()._assign_work_unit(node)

    return HeaviestFirst(config, log)


def pytest_addoption(parser):
    parser.addoption("--unit-seconds", metavar="FILE", default=None,
                     help="write each unit of work's seconds in this run to FILE (JSON; "
                          "units the run did not reach keep the seconds FILE had)")


_UNIT_RUN: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Sums each unit's seconds for `--unit-seconds` (in the controller under xdist)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        unit = work_unit(report.nodeid)
        _UNIT_RUN[unit] = _UNIT_RUN.get(unit, 0.0) + report.duration


def pytest_sessionfinish(session):
    path = session.config.getoption("--unit-seconds")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import json
    import vllm
    seconds = _unit_seconds(path)
    seconds.update({unit: round(s, 1) for unit, s in _UNIT_RUN.items()})
    with open(path, "w") as f:
        json.dump({"measured": f"vLLM {vllm.__version__}, "
                               f"{len(os.sched_getaffinity(0))} cores",
                   "seconds": dict(sorted(seconds.items(), key=lambda kv: -kv[1]))},
                  f, indent=1)
        f.write("\n")


# `import trl` sets VLLM_LOGGING_LEVEL=ERROR for its process unless it is set
# (trl/_compat.py), and the TRL modules import it while pytest collects: every engine
# and server this run starts would inherit it, and the tests that read vLLM's INFO
# lines (the start-up line, the refusal logs) would find none. The run keeps the level
# it started with.
_VLLM_LOGGING_LEVEL = os.environ.get("VLLM_LOGGING_LEVEL")


def pytest_collection_finish(session):
    if _VLLM_LOGGING_LEVEL is None:
        os.environ.pop("VLLM_LOGGING_LEVEL", None)
    else:
        os.environ["VLLM_LOGGING_LEVEL"] = _VLLM_LOGGING_LEVEL


def pytest_collection_modifyitems(config, items):
    """Marks the release tier (`RELEASE_TIER`). `gpu` tests run only where CUDA is
    available; elsewhere they are reported as skipped, with the reason (never
    silently deselected)."""
    _mark_release_tier(config, items)
    _check_mask_server_modules(config, items)
    _check_engine_units(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is "
                                   "False); on a GPU host: python -m pytest -m gpu")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
