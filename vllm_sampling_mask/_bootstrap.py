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
