"""`python -m vllm_sampling_mask.demo`: the demo (`tools.demo`)."""

from vllm_sampling_mask.tools.demo import main

if __name__ == "__main__":
    raise SystemExit(main())
