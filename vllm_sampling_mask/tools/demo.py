"""The main job on the demo model: serve it, generate, show each token's mask.

    python -m vllm_sampling_mask.demo [--port 8123] [--prompt TEXT]

Starts the stock `vllm serve` (the fork is active in it through the site
hook) on the demo model with `--return-sampling-mask`, float32, processed
logprobs and a 1 GB KV cache, on the runner vLLM picks (the V1 runner on a CPU
host, natively); sends one request to `POST /inference/v1/generate`; prints
each generated token with its logprob and the ids it was sampled from; then
stops the server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from vllm_sampling_mask import DEMO_MODEL


# Prompts the demo model (trained on Python source) continues well; any model takes them.
DEMO_PROMPTS = [
    "def main():\n    ",
    "import os\nimport sys\n\n",
    "class Parser:\n    def __init__(self",
    "    for i in range(",
    "# Copyright 2001 Python Software Foundation\n",
    "        return self.",
    "if __name__ == '__main__':\n",
    "    raise ValueError(",
]


def perturbed_draft(path: str, noise: float = 0.08, seed: int = 0) -> str:
    """A draft model for speculative decoding with the demo model: a copy of it at
    `path` whose every matrix has Gaussian noise of `noise` times its own spread
    added (seeded), so that it agrees with the demo model often, not always: a
    verify step accepts some drafts and rejects others. Returns `path`."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(DEMO_MODEL, path, dirs_exist_ok=True)
    weights = load_file(os.path.join(DEMO_MODEL, "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    weights = {name: w + noise * w.std() * torch.randn(w.shape, generator=generator)
               if w.ndim == 2 else w for name, w in weights.items()}
    save_file(weights, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return path


def eagle_head(path: str, seed: int = 0) -> str:
    """An EAGLE (1) draft head for the demo model at `path`, for speculative
    decoding with `"method": "eagle"`: one decoder layer, a copy of the demo
    model's last, fed by `fc`, which keeps the target's hidden state and adds a
    little seeded noise of the token's embedding. The embedding and the LM head are
    the target's (vLLM shares them when the head has none). Its drafts are poor
    (most are rejected, some accepted): what it exercises is EAGLE's path through
    the verify step, not its speed. Returns `path`."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(DEMO_MODEL, "config.json")) as f:
        config = json.load(f)
    last = f"model.layers.{config['num_hidden_layers'] - 1}."
    config.update(architectures=["EagleLlamaForCausalLM"], num_hidden_layers=1)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(DEMO_MODEL, name), path)
    weights = load_file(os.path.join(DEMO_MODEL, "model.safetensors"))
    # EAGLE's first layer has no input norm: it reads fc's output as it is.
    head = {"layers.0." + name[len(last):]: w for name, w in weights.items()
            if name.startswith(last) and "input_layernorm" not in name}
    hidden = config["hidden_size"]
    generator = torch.Generator().manual_seed(seed)
    fc = 0.01 * torch.randn(hidden, 2 * hidden, generator=generator)
    fc[:, hidden:] += torch.eye(hidden)        # [embedding | hidden state] -> hidden
    head["fc.weight"] = fc
    save_file(head, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return path


def server_command(port: int, model: str = DEMO_MODEL, extra=(), mask: bool = True
                   ) -> list[str]:
    """The `vllm serve` command line; `mask=False` leaves out `--return-sampling-mask`
    (the same `--logprobs-mode processed_logprobs`, so the two differ in the mask
    alone) and, on a release that serves `/inference/v1/generate` only behind an
    option of its own without it (`Release.generate_route_option`), adds that
    option, so both servers answer the same routes."""
    exe = os.path.join(os.path.dirname(sys.executable), "vllm")
    if mask:
        switch = ["--return-sampling-mask"]
    else:
        from vllm_sampling_mask.patches.apply import upstream_release
        switch = list(upstream_release().generate_route_option)
    return [exe, "serve", model, "--port", str(port), "--host", "127.0.0.1",
            "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
            "--kv-cache-memory-bytes", "1G", *switch,
            "--logprobs-mode", "processed_logprobs", *extra]


def server_env(runner: str | None = None) -> dict[str, str]:
    """The server's environment: as it is (vLLM picks the runner), or with the
    runner forced: "v1" (natively), "mrv2" (on a CPU host through Triton's
    interpreter, as the MRv2 tests run it)."""
    env = dict(os.environ)
    if runner == "v1":
        env.pop("TRITON_INTERPRET", None)
        env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    elif runner == "mrv2":
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1"
        import torch
        if not torch.cuda.is_available():
            env["TRITON_INTERPRET"] = "1"
    elif runner is not None:
        raise ValueError(f"runner must be None, 'v1' or 'mrv2', not {runner!r}")
    return env


def last_log_line(path: str) -> str:
    """The server log's last line without vLLM's prefix (process, level, time,
    source), shortened: what the server is doing now."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4096))
            lines = [l for l in f.read().decode(errors="replace").splitlines() if l.strip()]
    except OSError:
        return ""
    if not lines:
        return "starting Python and importing vLLM"
    # the last line vLLM's logger wrote (a Python warning's source line is no news)
    logged = [m for m in map(_LOG_PREFIX.match, lines) if m and m.group(2)]
    text = logged[-1].string[logged[-1].end():] if logged else _LOG_PREFIX.sub("", lines[-1])
    text = text.strip()
    return text if len(text) <= 100 else text[:97] + "..."


# vLLM's log prefix: the process, then level, date, time and [source]
_LOG_PREFIX = re.compile(r"^\s*(\(\w+ pid=\d+\) )?(\w+ \d\d-\d\d [\d:]+ \[[^\]]*\] )?")


class ServerExited(RuntimeError):
    """`vllm serve` exited before it answered `/health`: the message names its
    exit code, its log file and the log's last lines (the cause is there)."""


def log_tail(path: str | None, lines: int = 12) -> str:
    """The last `lines` non-blank lines of a log file ('' if unreadable)."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join([l for l in text.splitlines() if l.strip()][-lines:])


def port_problem(port: int, host: str = "127.0.0.1") -> str | None:
    """Why `vllm serve --port port` cannot listen on `host`, or None if it can."""
    import socket
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as e:
            return (f"port {port} is already in use on {host} ({e.strerror}): stop what "
                    f"listens there, or pick another port with --port")
    return None


def wait_healthy(base: str, proc: subprocess.Popen, timeout: float = 600,
                 log_path: str | None = None, every: float = 10,
                 server_log: str | None = None) -> None:
    """Poll `/health` until it answers 200. With `log_path`, say every `every`
    seconds how long it has waited and the server log's last line. A server that
    exits first raises `ServerExited` naming its log (`server_log`, else
    `log_path`) with the log's last lines."""
    server_log = server_log or log_path
    started = time.time()
    deadline = started + timeout
    said = started
    while time.time() < deadline:
        if log_path is not None and time.time() - said >= every:
            said = time.time()
            print(f"  ... {said - started:3.0f} s, waiting for the server: its last log "
                  f"line: {last_log_line(log_path)}", flush=True)
        if proc.poll() is not None:
            where = f"; its log is {server_log}" if server_log else ""
            tail = log_tail(server_log)
            raise ServerExited(f"vllm serve exited with code {proc.returncode} before it "
                               f"answered /health{where}"
                               + (f"; its last lines:\n{tail}" if tail else ""))
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    raise TimeoutError("vllm serve did not become healthy")


def post_json(url: str, body: dict, timeout: float = 600) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@contextlib.contextmanager
def serving(port: int, log_path: str, extra=(), runner: str | None = None, env=None,
            mask: bool = True, progress: bool = False):
    """Run `vllm serve` on the demo model (mask on) until the block exits; yields its URL.

    `env`: variables to set in the server's environment on top of `server_env`;
    `mask=False`: the same server without `--return-sampling-mask`; `progress`:
    print, every 10 s of start-up, what the server is doing."""
    with server_process(port, log_path, extra, runner, env, mask, progress) as (base, _):
        yield base


@contextlib.contextmanager
def server_process(port: int, log_path: str, extra=(), runner: str | None = None, env=None,
                   mask: bool = True, progress: bool = False):
    """`serving`, yielding (its URL, its process): the process is the API server's
    (the engine core and worker are its children)."""
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(server_command(port, extra=extra, mask=mask),
                                env={**server_env(runner), **(env or {})},
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(base, proc, log_path=log_path if progress else None,
                         server_log=log_path)
            yield base, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m vllm_sampling_mask.demo",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8123,
                    help="the port the demo's server listens on (default 8123)")
    ap.add_argument("--prompt", default="def main():\n    ",
                    help="the prompt to continue (tokenized with the demo model's tokenizer)")
    ap.add_argument("--max-tokens", type=int, default=12,
                    help="how many tokens to generate (default 12)")
    args = ap.parse_args()
    problem = port_problem(args.port)
    if problem is not None:   # before the 30-70 s start-up that would end the same way
        print(f"demo: error: {problem}", file=sys.stderr)
        sys.exit(2)

    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(DEMO_MODEL)
    prompt_ids = tok(args.prompt, add_special_tokens=False)["input_ids"]

    log_path = os.path.join(tempfile.gettempdir(), f"vllm-sampling-mask-demo-{args.port}.log")
    print("starting:", " ".join(server_command(args.port)), flush=True)
    print(f"(server log: {log_path}; start-up takes 30-70 s on 2 CPU cores)", flush=True)
    try:
        with serving(args.port, log_path, progress=True) as base:
            status, resp = generate(base, prompt_ids, args.max_tokens)
    except ServerExited as e:
        print(f"demo: error: {e}", file=sys.stderr)
        sys.exit(1)
    show(tok, args.prompt, status, resp)


def generate(base: str, prompt_ids, max_tokens: int) -> tuple[int, dict]:
    """The demo's request to the running server: (HTTP status, JSON answer)."""
    sampling = {"temperature": 0.8, "top_k": 20, "top_p": 0.9,
                "max_tokens": max_tokens, "logprobs": 0, "seed": 0}
    body = {"model": DEMO_MODEL, "token_ids": prompt_ids, "sampling_params": sampling}
    print(f"server ready; POST /inference/v1/generate with sampling_params "
          f"{json.dumps(sampling)}", flush=True)
    status, resp = post_json(base + "/inference/v1/generate", body)
    print("stopping the server", flush=True)
    return status, resp


def show(tok, prompt: str, status: int, resp: dict) -> None:
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {resp}")
    choice = resp["choices"][0]
    print(f"\nprompt: {prompt!r}")
    print(f"completion: {tok.decode(choice['token_ids'])!r}\n")
    logprobs = choice["logprobs"]["content"] if choice.get("logprobs") else None
    for t, (token, mask) in enumerate(zip(choice["token_ids"], choice["sampling_mask"])):
        lp = f"{logprobs[t]['logprob']:8.4f}" if logprobs else "       -"
        print(f"token {t:2d} {tok.decode([token])!r:>14} logprob {lp}  "
              f"support {len(mask):3d} ids: {mask[:8]}{' ...' if len(mask) > 8 else ''}")
    assert len(choice["sampling_mask"]) == len(choice["token_ids"])
    print("\nok: one sampling mask per generated token")


if __name__ == "__main__":
    main()
