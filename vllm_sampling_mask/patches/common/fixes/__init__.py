"""Patches of upstream modules every vLLM process may import (configuration, output
types, the platform): fixes of upstream bugs, active with the mask flag on or off."""
