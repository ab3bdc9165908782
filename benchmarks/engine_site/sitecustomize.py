"""Loaded at start-up by every process `bench_step_cost.py --timers` starts (it
puts this folder on PYTHONPATH): installs `step_timers` there."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import step_timers  # noqa: E402

step_timers.install()
