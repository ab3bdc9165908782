"""Patches of upstream modules every vLLM process may import (configuration, output
types, the platform)."""
