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
        from vllm_sampling_mask.patching import upstream_release
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
    text = re.sub(r"^(\(\w+ pid=\d+\) )?(\w+ \d\d-\d\d [\d:]+ \[[^\]]*\] )?", "",
                  lines[-1].strip())
    return text if len(text) <= 100 else text[:97] + "..."


def wait_healthy(base: str, proc: subprocess.Popen, timeout: float = 600,
                 log_path: str | None = None, every: float = 10) -> None:
    """Poll `/health` until it answers 200. With `log_path`, say every `every`
    seconds how long it has waited and the server log's last line."""
    started = time.time()
    deadline = started + timeout
    said = started
    while time.time() < deadline:
        if log_path is not None and time.time() - said >= every:
            said = time.time()
            print(f"  ... {said - started:3.0f} s, waiting for the server: its last log "
                  f"line: {last_log_line(log_path)}", flush=True)
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with code {proc.returncode}")
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
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(server_command(port, extra=extra, mask=mask),
                                env={**server_env(runner), **(env or {})},
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(base, proc, log_path=log_path if progress else None)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--prompt", default="def main():\n    ")
    ap.add_argument("--max-tokens", type=int, default=12)
    args = ap.parse_args()

    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(DEMO_MODEL)
    prompt_ids = tok(args.prompt, add_special_tokens=False)["input_ids"]

    log_path = os.path.join(tempfile.gettempdir(), f"vllm-sampling-mask-demo-{args.port}.log")
    print("starting:", " ".join(server_command(args.port)), flush=True)
    print(f"(server log: {log_path}; start-up takes 30-70 s on 2 CPU cores)", flush=True)
    with serving(args.port, log_path, progress=True) as base:
        sampling = {"temperature": 0.8, "top_k": 20, "top_p": 0.9,
                    "max_tokens": args.max_tokens, "logprobs": 0, "seed": 0}
        body = {"model": DEMO_MODEL, "token_ids": prompt_ids, "sampling_params": sampling}
        print(f"server ready; POST /inference/v1/generate with sampling_params "
              f"{json.dumps(sampling)}", flush=True)
        status, resp = post_json(base + "/inference/v1/generate", body)
        print("stopping the server", flush=True)
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {resp}")
    choice = resp["choices"][0]
    print(f"\nprompt: {args.prompt!r}")
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
