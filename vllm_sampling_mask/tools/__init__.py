"""Command-line tools: `demo` (python -m vllm_sampling_mask.demo), `replay_check`,
`seam_report`."""
