"""Fixes of upstream bugs, active with the mask flag on or off; each header names
the upstream issue or PR, or says none is known and what would be filed."""
