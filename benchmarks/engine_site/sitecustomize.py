"""Loaded at start-up by every process `bench_step_cost.py` and `bench_serving.py`
start (they put this folder on PYTHONPATH): installs in each process what the bench
asked for through the environment, `step_timers` (VSM_STEP_TIMERS, `--timers`), the
short idle poll (VSM_IDLE_POLL_S, `idle_poll.py`) and the API server's CPU profile
(VSM_API_PROFILE, `bench_serving.py --cprofile`, `api_profile.py`)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import api_profile  # noqa: E402
import idle_poll  # noqa: E402
import step_timers  # noqa: E402

if os.environ.get(step_timers.ENV):
    step_timers.install()
idle_poll.install()
api_profile.install()
