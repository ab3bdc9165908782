"""Integrations of the sampling mask into RL training frameworks.

One module per framework, each importing the framework only when it is imported
itself (``import vllm_sampling_mask.integrations`` imports none of them):

``vllm_sampling_mask.integrations.trl``
    ``MaskedGRPOTrainer``: TRL's ``GRPOTrainer`` with sampling masks from its vLLM
    rollouts (server and colocate mode) used in its loss. Its reliance on TRL is
    data in ``integrations.seams`` (``TRL_SEAMS``), checked against the installed TRL
    by ``tests/test_trl_seams.py``.
"""
