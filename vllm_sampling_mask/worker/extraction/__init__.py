"""Mask extraction on the device: which ids survived every logits processor.

Plain package (torch, and Triton where it is installed; no vLLM). The runner's mask
state (`worker.state.SamplingMaskState.extract`) calls `extract_support` on the
processed logits the sampler drew from (a non-finite logit marks an excluded id) right
after sampling. The result stays on the device in one int32 block (`layout`) that
`transport` copies to the host as a whole.

Only the rows of requests that want a mask are extracted (`rows`, the batch rows, in
order), less the rows whose sample the runner discards (partial prefill chunks:
`DeviceMask.idle`, decoded as sampled nothing); the others cost nothing.

Three implementations write the same block: the Triton kernel (`kernels`), the host
path (`host`: CPU hosts, numpy over the logits' own memory) and torch (`torch_path`:
devices without Triton, logits numpy cannot read). Slot numbers may differ between them
(the kernel claims slots with an atomic); the decoded supports may not. On a CPU host
the state skips the block: `extract_on_host` reads the logits straight into the host
form.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_sampling_mask.worker.extraction import host, kernels, torch_path
from vllm_sampling_mask.worker.extraction.host import extract_on_host, host_readable
from vllm_sampling_mask.worker.extraction.kernels import warm_up
from vllm_sampling_mask.worker.extraction.layout import (DEFAULT_SETTINGS, HEADER, META,
                                                         NO_SLOT, NOT_WIDE, DeviceMask,
                                                         ExtractionSettings, HostSupports,
                                                         MaskLayout, n_words, plan_layout)

__all__ = ["DEFAULT_SETTINGS", "HEADER", "META", "NO_SLOT", "NOT_WIDE", "DeviceMask",
           "ExtractionSettings", "HostSupports", "MaskLayout", "extract_on_host",
           "extract_selected", "extract_support", "host_index", "host_readable",
           "n_words", "no_rows", "plan_layout", "plan_step", "warm_up"]


def host_index(values, device, dtype=np.int64) -> torch.Tensor:
    """Host ints as an index tensor on `device` without a host synchronisation: on
    an accelerator through pinned memory and an asynchronous copy (a copy from
    pageable memory would wait for the whole stream)."""
    index = torch.from_numpy(np.ascontiguousarray(values, dtype=dtype))
    if torch.device(device).type != "cpu":
        index = index.pin_memory().to(device, non_blocking=True)
    return index


def extract_support(processed_logits: torch.Tensor, layout: MaskLayout,
                    rows: np.ndarray | None = None, *,
                    implementation: str | None = None,
                    settings: ExtractionSettings = DEFAULT_SETTINGS) -> DeviceMask:
    """Compact the finite entries of the given rows of `processed_logits`.

    `rows` (host ints, ascending) are the batch rows to extract; None means all.
    `implementation` (None: chosen for the logits) is "triton" (the kernel: on
    CUDA, or under Triton's interpreter in the CPU tests), "host" (numpy over a
    CPU tensor's own memory, `host.write_block`) or "torch" (anywhere). The
    default: the kernel on CUDA with Triton, the host path for CPU logits numpy
    reads, torch otherwise. Issues no host synchronisation on the kernel path.
    """
    batch_rows, vocab = processed_logits.shape
    picked = batch_rows if rows is None else len(rows)
    if (picked, vocab) != (layout.rows, layout.vocab_size):
        raise ValueError(f"extract_support: {picked} rows of {vocab} logits do not "
                         f"match the layout ({layout.rows}, {layout.vocab_size})")
    if implementation is None:
        implementation = ("triton" if kernels.triton is not None and processed_logits.is_cuda
                          else "host" if host_readable(processed_logits) else "torch")
    device = processed_logits.device
    block = torch.empty(HEADER + layout.numel, dtype=torch.int32, device=device)
    # The header's first entry is the kernel's slot counter; the block proper
    # starts after it, 16-byte aligned.
    if implementation in ("triton", "torch"):
        source = None if rows is None else host_index(rows, device, np.int32)
    if implementation == "triton":
        kernels.write_block(processed_logits, source, block, layout, settings.kernel_chunk)
    elif implementation == "host":
        if not host_readable(processed_logits):
            raise ValueError("extract_support: the host path reads float CPU tensors "
                             f"numpy can view, not {processed_logits.dtype} on "
                             f"{processed_logits.device}")
        host.write_block(processed_logits.detach().numpy(), rows, block[HEADER:].numpy(),
                         layout)
    elif implementation == "torch":
        torch_path.write_block(processed_logits, source, block[HEADER:], layout,
                               settings.chunk_elements)
    else:
        raise ValueError(f"extract_support: no implementation {implementation!r} "
                         "(triton, host or torch)")
    return DeviceMask(block=block[HEADER:], layout=layout, batch_rows=batch_rows,
                      rows=None if rows is None else np.asarray(rows))


def no_rows(batch_rows: int, device) -> DeviceMask:
    """The mask of a step in which no request wants one."""
    return DeviceMask(block=torch.empty(0, dtype=torch.int32, device=device),
                      layout=MaskLayout(0, 1, 0, 1), batch_rows=batch_rows,
                      rows=np.zeros(0, dtype=np.int64))


# -- for tests and benchmarks: the runner plans its rows itself (`worker.plan`) and
# calls `extract_support` / `extract_on_host`

def plan_step(top_k: np.ndarray, wanted: np.ndarray, vocab_size: int, *, max_size: int,
              worst_case: bool = False, settings: ExtractionSettings = DEFAULT_SETTINGS):
    """The host work of one step before any launch: (layout, rows), rows None
    for all; layout None when no row wants a mask. Vectorised: its cost does
    not grow with a Python loop over the batch."""
    wanted = np.asarray(wanted, dtype=bool)
    if not worst_case and not wanted.any():
        return None, None
    rows = None if worst_case or wanted.all() else np.flatnonzero(wanted)
    top_k = np.asarray(top_k)
    layout = plan_layout(top_k if rows is None else top_k[rows], vocab_size,
                         max_size=max_size, worst_case=worst_case, settings=settings)
    return layout, rows


def extract_selected(processed_logits: torch.Tensor, top_k: np.ndarray,
                     wanted: np.ndarray, *, max_size: int, worst_case: bool = False,
                     settings: ExtractionSettings = DEFAULT_SETTINGS) -> DeviceMask:
    """Tests' and benchmarks' entry: extract the batch rows that want a mask
    (`wanted`, a host bool per row), laid out from their host-side `top_k`. The
    memory-profiling run (`worst_case`) extracts every row at the widest."""
    layout, rows = plan_step(top_k, wanted, processed_logits.shape[1], max_size=max_size,
                             worst_case=worst_case, settings=settings)
    if layout is None:
        return no_rows(len(wanted), processed_logits.device)
    return extract_support(processed_logits, layout, rows, settings=settings)

