"""Site hook: runs at every interpreter start via `vllm_sampling_mask.pth`.

It only registers post-import hooks (nothing of vLLM or torch is imported
here), so interpreters that never import vLLM pay almost nothing. Spawned
engine-core and worker processes run this too, which is what makes the
overlay active in every process vLLM starts. VLLM_SAMPLING_MASK_DISABLE=1
leaves stock vLLM untouched.
"""

from vllm_sampling_mask.patches.apply import disabled, install_hooks

if not disabled():
    install_hooks()
    # SkyRL's trainer: the coverage metric and the tied LM head
    # (vllm_sampling_mask.integrations.skyrl), patched when SkyRL imports these
    # modules; nothing is imported before
    import wrapt

    wrapt.register_post_import_hook(
        "vllm_sampling_mask.integrations.skyrl:patch_model_wrapper",
        "skyrl.backends.skyrl_train.workers.model_wrapper")
    wrapt.register_post_import_hook(
        "vllm_sampling_mask.integrations.skyrl:patch_worker",
        "skyrl.backends.skyrl_train.workers.worker")
    wrapt.register_post_import_hook(
        "vllm_sampling_mask.integrations.skyrl:patch_fsdp_strategy",
        "skyrl.backends.skyrl_train.distributed.fsdp_strategy")
