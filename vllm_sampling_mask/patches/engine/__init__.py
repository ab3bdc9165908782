"""Patches that act in the engine core (the scheduler)."""
