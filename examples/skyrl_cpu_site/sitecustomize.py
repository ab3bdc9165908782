"""For examples/skyrl_cpu.py only: its processes (the driver, Ray's workers, vLLM's
engine-core process) start with this directory on PYTHONPATH, so each installs the
harness's CPU-host stand-ins (post-import hooks: nothing is imported here but wrapt)."""

import skyrl_cpu

skyrl_cpu.install_stand_ins()
