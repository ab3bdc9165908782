"""The API server / LLM front end: the request's mask switch checked (`validation`),
each request's supports accumulated (`accumulator`), the `SamplingMask` the user gets
(`sampling_mask`)."""
