"""The model runner's side of the mask: one small state per concern.

Plain modules (numpy, torch; no vLLM import), in the style of Model Runner V2's own
`*State` classes. The runner adapters (`patches/worker/feature/runner*.py`,
`sampler*.py`) are thin: they read upstream's host arrays and call these.

- `requests.MaskRequests`: per request slot (MRv2) or batch row (V1), does the
  request want a mask, did it ask for support logprobs;
- `plan.StepPlan`: one sampler call's plan, decided on the host before the call
  (rows to extract, rows that asked, the top-k bound, rows whose sample is
  discarded, the profiling run); a verify step's (speculative decoding) has one
  row per position (`plan.per_token`), and its parts their own (`plan.part`);
- `capture.ScaledCapture`: the scaled distribution's top logprob of the rows that
  asked, handed explicitly to the call that holds the scaled logits;
- `step.MaskStep`: one sampler call's mask in one line, plan -> extraction ->
  copy, opened by the runner adapter around the call that samples and read by it
  once the call returned;
- `state.SamplingMaskState`: the runner's one object holding the above, the pinned
  pool, the work counters and the profiling switch.
"""
