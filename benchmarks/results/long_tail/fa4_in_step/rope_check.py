"""Liger's RoPE forward + backward at the 1.5B update's shapes (12 query / 2 K/V heads of 128, ~30k packed tokens)
over a run of packed lengths, some repeated: which implementation Liger's dispatch takes here and what each new
length costs (a CuTe DSL kernel that compiles per token count shows a slow call at every new length). Run on a GPU
machine by call_installed_next.sh, with and without the fa4 extra's packages."""

import os
import sys
import time

import torch

t0 = time.perf_counter()
from liger_kernel.backends.dispatch import resolve_impl  # noqa: E402  (import time is part of what is reported)
from liger_kernel.transformers.rope import liger_rotary_pos_emb as rope  # noqa: E402

dev = torch.device("cuda")


def once(T: int) -> float:
    q0 = torch.randn(1, T, 12 * 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k0 = torch.randn(1, T, 2 * 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
    q, k = q0.view(1, T, 12, 128).transpose(1, 2), k0.view(1, T, 2, 128).transpose(1, 2)
    c = torch.randn(1, T, 128, device=dev, dtype=torch.bfloat16)
    s = torch.randn_like(c)
    gq = torch.randn(1, T, 12, 128, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    gk = torch.randn(1, T, 2, 128, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    torch.cuda.synchronize()
    t = time.perf_counter()
    a, b = rope(q, k, c, s)
    torch.autograd.backward([a, b], [gq, gk])
    torch.cuda.synchronize()
    return time.perf_counter() - t


once(30000)
print("impl", resolve_impl("rope", device=dev).impl_name, "| LIGER_KERNEL_IMPL_ROPE =",
      os.environ.get("LIGER_KERNEL_IMPL_ROPE"), "| cutlass loaded:", "cutlass" in sys.modules,
      f"| import + first call {time.perf_counter() - t0:.2f} s")
for T in (30000, 30000, 29871, 29871, 30517, 28004, 31111, 30517):   # a new T: a new packed micro-batch length
    print(f"T={T} fwd+bwd {1e3 * once(T):.1f} ms")
utils = sys.modules.get("liger_kernel.ops.cutedsl.ops.utils")
print("cute.compile cache entries:", len(utils._COMPILE_CACHE) if utils else "n/a (cutedsl not loaded)")
