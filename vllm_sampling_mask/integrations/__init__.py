"""Integrations of the sampling mask into RL training frameworks.

One module per framework, each importing the framework only when it is imported
itself (``import vllm_sampling_mask.integrations`` imports none of them):

``vllm_sampling_mask.integrations.trl``
    ``MaskedGRPOTrainer``: TRL's ``GRPOTrainer`` with sampling masks from its vLLM
    rollouts (server and colocate mode) used in its loss. Its reliance on TRL is
    data in ``integrations.seams`` (``TRL_SEAMS``), checked against the installed TRL
    by ``tests/integrations/test_framework_seams.py``.

``vllm_sampling_mask.integrations.skyrl``
    ``SampleSupportRoute``: SkyRL's sample-support replay fed the engine's exact
    support (its ``/skyrl/v1/generate`` route, loaded by vLLM's ``--middleware`` from
    SkyRL's ``engine_init_kwargs``), in the ``[tokens, top_k]`` layout its trainer
    reads. Its reliance on SkyRL is ``SKYRL_SEAMS`` in ``integrations.seams``, checked
    by ``tests/integrations/test_framework_seams.py``.

``vllm_sampling_mask.integrations.verl``
    Loaded by ``import verl`` (``verl.plugins`` entry point,
    ``integrations.verl_plugin``): verl's vLLM server puts each sample's mask in its
    ``extra_fields``, and ``FSDPEngineWithLMHead.prepare_model_outputs`` takes the
    response log-probabilities over it. Its reliance on verl is ``VERL_SEAMS`` in
    ``integrations.seams``, checked by ``tests/integrations/test_framework_seams.py``.

``vllm_sampling_mask.integrations.openrlhf``
    Run as ``python -m vllm_sampling_mask.integrations.openrlhf <train_ppo_ray
    arguments>`` (OpenRLHF has no plugin mechanism): its patches, installed in every
    Ray worker, carry each sample's mask from ``RolloutRayActor`` into the
    ``Experience`` and take ``Actor.forward``'s log-probabilities over it, so the old
    log-probabilities and ``PolicyLoss``'s correction read the support. Its patches
    are recorded in ``PATCHES``; its reliance on OpenRLHF is ``OPENRLHF_SEAMS`` in
    ``integrations.seams``, checked by ``tests/integrations/test_framework_seams.py``.
"""
