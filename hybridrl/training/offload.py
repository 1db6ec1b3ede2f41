"""Move FSDP parameter shards and optimizer state between the GPU and host memory around phases
(`fsdp_config.param_offload` / `optimizer_offload`, the rollout rows of the memory-phase table).

Both go to host twins allocated at the first offload and kept for the next ones (`_HOST_TWINS`, `_PARAM_TWINS`
below): a copy into fresh pageable memory stages through a bounce buffer and faults in every page, about 1.2 GB/s for
a 7B model's 57 GiB of AdamW state, where a copy into pinned memory runs at the link's speed and asynchronously. The
price is that what is offloaded stays pinned in host memory for the whole run, on the GPU or not. The twins are
views into a few pinned buffers of power-of-two sizes (`pack_pow2`: torch rounds each pinned allocation up to one,
which with one buffer per tensor nearly doubled a 7B model's 60.9 GB of AdamW state). Without CUDA (CPU runs, tests)
the twins are plain host tensors and the same code runs.

Choices:
- Parameters: each parameter's storage is copied to its twin and then resized to 0 bytes, and on load resized back
  and refilled, so every tensor object stays what it was: FSDP2's sharded DTensors, its padded shard data and the
  local tensors that view it (`module.to` would replace them and make FSDP2 re-pad its shards into fresh pageable
  memory); the memory returns to the caching allocator. Gradients are dropped on offload (they exist only inside an
  update); buffers stay (a few KB). A module whose storages cannot be resized (memory-mapped from a checkpoint)
  goes with `module.to("cpu")`, and a module not offloaded this way is moved with `module.to(device)` on load.
- Optimizer state tensors (AdamW's exp_avg, exp_avg_sq, step) are replaced in `optimizer.state`, keeping their keys
  so checkpoints and the next step see the same structure; AdamW's scalar `step` stays on the host where torch
  keeps it (a CUDA step tensor is only legal with capturable=True). DTensor state keeps its spec.
- `torch.cuda.empty_cache()` runs after an offload so the freed blocks return to the pool other phases use.
"""

from __future__ import annotations

import os
import warnings
import weakref

import torch
from torch.distributed.tensor import DTensor

__all__ = ["offload_fsdp_params", "load_fsdp_params", "offload_optimizer", "load_optimizer"]


def _empty_cache():
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


_PARAMS_OUT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> [(storage, bytes, twin, device)]
_PARAM_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> {param index: host twin}
_HOST_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> {(param, key): host twin}


@torch.no_grad()
def offload_fsdp_params(module: torch.nn.Module) -> None:
    module.zero_grad(set_to_none=True)
    if module in _PARAMS_OUT:
        return
    locals_ = [_local(p.data) for p in module.parameters()]
    if not all(t.untyped_storage().resizable() for t in locals_):   # e.g. memory-mapped from a checkpoint
        module.to("cpu")
        _empty_cache()
        return
    twins = _PARAM_TWINS.setdefault(module, {})
    moving, seen = [], set()
    for i, local in enumerate(locals_):
        storage = local.untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in seen:   # empty shard, or a tied parameter seen already
            continue
        seen.add(storage.data_ptr())
        moving.append((i, storage, _bytes_of(storage, local.device)))
    _host_twins(twins, [(i, data) for i, _, data in moving])
    out = []
    for i, storage, data in moving:
        twin = twins[i]
        twin.copy_(data, non_blocking=twin.is_pinned())
        out.append((storage, storage.nbytes(), twin, data.device))
    if any(t.is_pinned() for _, _, t, _ in out):
        torch.cuda.synchronize()   # the copies are complete before their source is freed
    for storage, *_ in out:
        storage.resize_(0)
    _PARAMS_OUT[module] = out
    _empty_cache()


@torch.no_grad()
def load_fsdp_params(module: torch.nn.Module, device) -> None:
    out = _PARAMS_OUT.pop(module, None)
    if out is None:
        module.to(torch.device(device), non_blocking=True)
        return
    for storage, nbytes, twin, where in out:
        storage.resize_(nbytes)
        _bytes_of(storage, where).copy_(twin, non_blocking=twin.is_pinned())


def _bytes_of(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    """A uint8 tensor over the whole of `storage`."""
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (storage.nbytes(),), (1,))


def _local(value: torch.Tensor) -> torch.Tensor:
    return value.to_local() if isinstance(value, DTensor) else value


def _like(value: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """`local` in the place of `value`'s data: a DTensor keeps its spec (mesh, placements, global shape). Built as
    FSDP2 builds its own (`DTensor(local, spec)`): `DTensor.from_local` would move a host tensor back to the mesh's
    device."""
    if isinstance(value, DTensor):
        return DTensor(local, value._spec, requires_grad=False)
    return local


_PINNING_SET: list = []


def _pin_with_threads() -> None:
    """Have torch pin host memory by registering a malloc'd range whose pages several threads fault in, unless the
    user's allocator settings say how to pin: a single-threaded cudaHostAlloc pins ~1.4 GB/s, 8 threads ~6 GB/s
    (H200 host, 12 GB of AdamW state: 9.0 s against 1.9 s)."""
    _PINNING_SET.append(True)
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + os.environ.get("PYTORCH_ALLOC_CONF", "")
    if "pinned_" not in conf:
        threads = 1 << max(0, min(8, os.cpu_count() or 1).bit_length() - 1)   # a power of two, as torch requires
        with warnings.catch_warnings():   # torch 2.11 warns about the private setter it still honours
            warnings.simplefilter("ignore")
            torch.cuda.memory._set_allocator_settings(
                f"pinned_use_cuda_host_register:True,pinned_num_register_threads:{threads}")


PIN_ALIGN = 512   # bytes: where each twin starts inside its buffer (a multiple of every dtype's size)


def pack_pow2(sizes: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """Pack byte sizes into buffers whose sizes are powers of two -> (buffer sizes, (buffer, offset) per size, in
    order). Best-fit decreasing, each buffer at least a minimum size, the minimum that wastes least among 1 MiB ..
    1 TiB; a buffer shrinks to the power of two its contents need. Offsets are multiples of PIN_ALIGN."""
    aligned = [-(-n // PIN_ALIGN) * PIN_ALIGN for n in sizes]
    order = sorted(range(len(sizes)), key=lambda i: -aligned[i])
    best, total = None, sum(aligned)
    for k in range(20, 41):
        if (1 << k) >= 2 * total and best is not None:   # one buffer holds everything from here on
            break
        caps, used, places = [], [], [None] * len(sizes)
        for i in order:
            n = aligned[i]
            fits = [b for b in range(len(caps)) if caps[b] - used[b] >= n]
            if fits:
                b = min(fits, key=lambda b: caps[b] - used[b])
            else:
                b = len(caps)
                caps.append(max(1 << max(0, n - 1).bit_length(), 1 << k))
                used.append(0)
            places[i] = (b, used[b])
            used[b] += n
        caps = [min(c, 1 << max(0, u - 1).bit_length()) for c, u in zip(caps, used)]
        if best is None or sum(caps) < sum(best[0]):
            best = (caps, places)
    return best


def _pinned_bytes(n: int) -> torch.Tensor:
    return torch.empty(n, dtype=torch.uint8, pin_memory=True)


def _host_twins(twins: dict, wanted: list) -> None:
    """Give every (slot, like) of `wanted` its host twin in `twins`, kept for the run: made again only where the
    shape or dtype changed. Where CUDA is, the new twins are views into pinned buffers packed by `pack_pow2`: torch's
    pinned allocator rounds each allocation up to a power of two, so one buffer per tensor comes to 115.8 GB of host
    memory for a 7B model's 60.9 GB of AdamW state by that rule (a 2.2 GB embedding pins 4.3 GB); packed, 61.2 GB
    (tests/training/test_offload_twins.py). Without CUDA (CPU runs, tests) they are plain host tensors."""
    missing = [(slot, like) for slot, like in wanted
               if (t := twins.get(slot)) is None or t.shape != like.shape or t.dtype != like.dtype]
    if not missing:
        return
    if not torch.cuda.is_available():
        for slot, like in missing:
            twins[slot] = torch.empty(like.shape, dtype=like.dtype)
        return
    if not _PINNING_SET:
        _pin_with_threads()
    sizes = [like.numel() * like.element_size() for _, like in missing]
    caps, places = pack_pow2(sizes)
    buffers = [_pinned_bytes(cap) for cap in caps]
    for (slot, like), (b, offset), n in zip(missing, places, sizes):
        twins[slot] = buffers[b][offset:offset + n].view(like.dtype).view(like.shape)


def _state_tensors(optimizer: torch.optim.Optimizer):
    """(param, key, state dict, tensor) of every state tensor but AdamW's scalar `step`."""
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if key != "step" and isinstance(value, torch.Tensor):
                yield param, key, state, value


@torch.no_grad()
def offload_optimizer(optimizer: torch.optim.Optimizer) -> None:
    pinned = torch.cuda.is_available()
    twins = _HOST_TWINS.setdefault(optimizer, {})
    moving = [(param, key, state, value) for param, key, state, value in _state_tensors(optimizer)
              if _local(value).device.type != "cpu"]
    if pinned:
        _host_twins(twins, [((param, key), _local(value)) for param, key, _, value in moving])
    copied = False
    for param, key, state, value in moving:
        local = _local(value)
        if pinned:
            host = twins[(param, key)]
            host.copy_(local, non_blocking=True)
            copied = True
        else:
            host = local.to("cpu")
        state[key] = _like(value, host)
    if copied:
        torch.cuda.synchronize()  # the host copies are complete before anything reads them (a checkpoint)
    _empty_cache()


@torch.no_grad()
def load_optimizer(optimizer: torch.optim.Optimizer, device) -> None:
    device = torch.device(device)
    for _, key, state, value in _state_tensors(optimizer):
        local = _local(value)
        if local.device != device:
            state[key] = _like(value, local.to(device, non_blocking=True))
