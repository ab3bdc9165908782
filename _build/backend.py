"""PEP 517 backend: setuptools, plus the site hook at the root of every wheel.

`vllm_sampling_mask.pth` must land directly in site-packages so that Python's
`site` module runs it at every interpreter start (that is what activates the
overlay in `vllm` CLI, `from vllm import LLM` and vLLM's spawned processes).
setuptools cannot place such a file for editable installs, so this backend
builds the wheel with setuptools and then adds the file, with its RECORD line.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tempfile
import zipfile

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (the other PEP 517 hooks)

PTH_NAME = "vllm_sampling_mask.pth"
PTH_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH_NAME)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"{name},sha256={digest.decode()},{len(data)}\n"


def _add_pth(wheel_path: str) -> None:
    with open(PTH_SOURCE, "rb") as f:
        pth = f.read()
    fd, tmp = tempfile.mkstemp(suffix=".whl", dir=os.path.dirname(wheel_path))
    os.close(fd)
    with zipfile.ZipFile(wheel_path) as src, \
            zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith(".dist-info/RECORD"):
                data += _record_line(PTH_NAME, pth).encode()
                record = (item, data)
                continue
            dst.writestr(item, data)
        dst.writestr(PTH_NAME, pth)
        dst.writestr(*record)  # RECORD goes last, as the wheel spec asks
    shutil.move(tmp, wheel_path)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    _add_pth(os.path.join(wheel_directory, name))
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    _add_pth(os.path.join(wheel_directory, name))
    return name
