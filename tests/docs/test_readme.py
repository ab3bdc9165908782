"""README.md's snippet and commands, run as printed, in a clean environment.

"Clean": none of the variables the rest of the suite sets (TRITON_INTERPRET,
VLLM_USE_V2_MODEL_RUNNER, VLLM_CPU_KVCACHE_SPACE, ...), so a new user's shell.
The served command gets a free port appended (the README's is vLLM's default,
8000), and the curl line and the `openai` example are sent to that port.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

import pytest
import requests
from conftest import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SET_BY_TESTS = ("TRITON_INTERPRET", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_CPU_KVCACHE_SPACE",
                "VLLM_ALLOW_INSECURE_SERIALIZATION", "VLLM_ENABLE_V1_MULTIPROCESSING")


def blocks(language: str) -> list[str]:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SET_BY_TESTS}
    bindir = os.path.dirname(sys.executable)           # the venv, as if activated
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def command(prefix: str) -> str:
    (line,) = [l for b in blocks("bash") for l in b.splitlines() if l.startswith(prefix)]
    return line


def test_readme_python_snippet_runs_as_printed(tmp_path):
    (snippet,) = blocks("python")
    script = tmp_path / "snippet.py"
    script.write_text(snippet)
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=clean_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    tokens, masks = [eval(l) for l in r.stdout.splitlines() if l.startswith("[")][-2:]
    assert len(tokens) == len(masks) == 8
    assert all(t in m and 1 <= len(m) <= 50 for t, m in zip(tokens, masks))
    # float32 rollouts, said before the wait; no compile step
    output = r.stdout + r.stderr
    assert "Downcasting" not in output and "dtype=torch.float32" in output
    assert "starting the engine" in r.stdout
    assert "enforce_eager=True" in snippet        # compiling: minutes without output


def test_readme_serve_and_curl_run_as_printed(tmp_path):
    port = free_port()
    serve = command("vllm serve") + f" --port {port}"
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(["bash", "-c", serve], cwd=tmp_path, env=clean_env(),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 300
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=5).ok:
                    break
            except requests.ConnectionError:
                pass
            assert time.time() < deadline, "vllm serve did not become healthy"
            time.sleep(1)
        curl = command("curl").replace("localhost:8000", f"localhost:{port}")
        r = subprocess.run(["bash", "-c", curl], env=clean_env(), capture_output=True,
                           text=True, timeout=120)
        import json
        (choice,) = json.loads(r.stdout)["choices"]
        assert len(choice["sampling_mask"]) == len(choice["token_ids"]) == 4
        # served as `demo`: a wrong model name's error lists that short name
        assert "--served-model-name demo" in serve and '"model": "demo"' in curl
        wrong = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                              json={"model": "nope", "prompt": "x", "max_tokens": 1})
        message = wrong.json()["error"]["message"]
        assert wrong.status_code == 404 and "nope" in message
        if "Valid" in message:   # the releases whose error lists the served names (0.32)
            assert "demo" in message, message
        text = (tmp_path / "serve.log").read_text()
        assert "Sampling masks on" in text and "V1 model runner" in text
        assert "--dtype float32" in serve and "dtype=torch.float32" in text
        # the openai-client example, against the same server
        (example,) = blocks("py")
        script = tmp_path / "chat.py"
        script.write_text(example.replace("localhost:8000", f"localhost:{port}"))
        r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=clean_env(),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        tokens, masks = [eval(l) for l in r.stdout.splitlines() if l.startswith("[")][-2:]
        assert len(tokens) == len(masks) == 8
        assert all(t in m for t, m in zip(tokens, masks))
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()


@pytest.mark.parametrize("prefix", ["python -m vllm_sampling_mask.demo"])
def test_readme_main_job_runs_as_printed(prefix, tmp_path):
    r = subprocess.run(["bash", "-c", command(prefix)], cwd=tmp_path, env=clean_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "ok: one sampling mask per generated token" in r.stdout
    # it says what it waits for, and what it sent
    assert "waiting for the server: " in r.stdout
    assert 'sampling_params {"temperature": 0.8, "top_k": 20, "top_p": 0.9' in r.stdout
    # its server log ends without a traceback (the shutdown was asked for)
    log = os.path.join(tempfile.gettempdir(), "vllm-sampling-mask-demo-8123.log")
    with open(log) as f:
        text = f.read()
    assert "Traceback" not in text and "EngineDeadError:" not in text, text[-3000:]


def test_readme_names_the_supported_releases():
    """The first page's range is `releases.SUPPORTED`: runs of consecutive minor
    releases, "A and B to C" (a release added or dropped in `releases.py` fails here
    until the README says it)."""
    from vllm_sampling_mask.releases import SUPPORTED

    runs: list[list[str]] = []
    for version in SUPPORTED:
        minor = int(version.split(".")[1])
        if runs and int(runs[-1][-1].split(".")[1]) + 1 == minor:
            runs[-1].append(version)
        else:
            runs.append([version])
    spans = [run[0] if len(run) == 1 else f"{run[0]} to {run[-1]}" for run in runs]
    named = ", ".join(spans[:-1]) + " and " + spans[-1] if len(spans) > 1 else spans[0]
    with open(os.path.join(ROOT, "README.md")) as f:
        first_page = " ".join(f.read().split())
    assert f"vLLM {named}," in first_page
