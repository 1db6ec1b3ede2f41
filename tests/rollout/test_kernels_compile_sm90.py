"""The rollout's Triton kernels compile for Hopper (sm_90) as they are launched, without a GPU: each launch of the
paged decode attention (single pass, split, cascade), its merge, the sampler (one chunk, several) and the fused decode
MLP is recorded and
its exact signature and compile-time constants go through Triton's whole pipeline to a cubin (ptxas ships with
triton). The interpreter tests check what the kernels compute; this checks what the interpreter never does: the
GPU compile of every specialisation, branches a launch never takes included."""

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is not installed")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from hybridrl.models import fused_mlp  # noqa: E402
from hybridrl.rollout import triton_decode, triton_sample  # noqa: E402
from hybridrl.rollout.shared_prefix import SharedPrefix  # noqa: E402

OPTIONS = ("num_warps", "num_stages")
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32",
          torch.int64: "i64"}


def _type(arg) -> str:
    if isinstance(arg, torch.Tensor):
        return "*" + DTYPES[arg.dtype]
    if isinstance(arg, bool):
        return "i1"
    if isinstance(arg, int):
        return "i32" if -2**31 <= arg < 2**31 else "i64"
    return "fp32"


class Compiles:
    """Stands in for a kernel: compiles each distinct launch for sm_90 instead of running it."""

    def __init__(self, kernel):
        self.kernel, self.built = kernel, {}

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            signature = {name: _type(a) for name, a in zip(self.kernel.arg_names, args)}
            constexprs = {k: v for k, v in kwargs.items() if k not in OPTIONS}
            signature.update({k: "constexpr" for k in constexprs})
            key = tuple(sorted(signature.items())) + tuple(sorted(constexprs.items()))
            if key not in self.built:
                compiled = triton.compile(ASTSource(fn=self.kernel, signature=signature, constexprs=constexprs),
                                          target=GPUTarget("cuda", 90, 32),
                                          options={k: kwargs[k] for k in OPTIONS if k in kwargs})
                self.built[key] = len(compiled.asm["cubin"])
        return launch


@pytest.fixture
def compiled(monkeypatch):
    kernels = {}
    for module, name in ((triton_decode, "_paged_decode_kernel"), (triton_decode, "_merge_splits_kernel"),
                         (triton_sample, "_sample_kernel"), (triton_sample, "_merge_kernel"),
                         (fused_mlp, "fused_mlp_partials"), (fused_mlp, "reduce_partials")):
        kernels[name] = Compiles(getattr(module, name))
        monkeypatch.setattr(module, name, kernels[name])
    monkeypatch.setattr(triton_decode, "num_sms", lambda index: 132)
    return kernels


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decode_attention_compiles_for_sm90_single_pass_split_and_cascade(compiled, dtype):
    N, K, D, page, blocks = 12, 2, 128, 16, 8
    k_cache = torch.zeros(4, page, K, D, dtype=dtype)
    for B, splits, prefix in ((4, 1, None), (4, 3, None), (4, 1, True)):
        q = torch.zeros(B, N, D, dtype=dtype)
        lens = torch.full((B,), 40, dtype=torch.int32)
        shared = SharedPrefix(torch.full((B,), 32, dtype=torch.int32), torch.zeros(1, dtype=torch.int64),
                              torch.full((1,), B, dtype=torch.int64)) if prefix else None
        triton_decode.paged_decode_triton(q, k_cache, k_cache, torch.zeros(B, blocks, dtype=torch.int32), lens,
                                          D ** -0.5, num_splits=splits, prefix=shared)
    assert len(compiled["_paged_decode_kernel"].built) == 3       # single pass, split, cascade
    assert all(size > 0 for size in compiled["_paged_decode_kernel"].built.values())
    assert len(compiled["_merge_splits_kernel"].built) == 2       # split, cascade


def test_sampler_compiles_for_sm90_one_chunk_and_several(compiled):
    V = 151936
    for B in (1, 320):
        triton_sample.sample_plain(torch.zeros(B, V, dtype=torch.bfloat16), torch.ones(B), all_greedy=True)
    triton_sample.sample_plain(torch.zeros(2, V, dtype=torch.bfloat16), torch.ones(2), torch.Generator())
    assert len(compiled["_sample_kernel"].built) == 3              # several chunks (greedy, sampled), one chunk
    assert len(compiled["_merge_kernel"].built) == 1


def test_fused_decode_mlp_compiles_for_sm90(compiled, monkeypatch):
    monkeypatch.setattr(fused_mlp.torch.Tensor, "is_cuda", property(lambda t: True))   # the GPU's launch options
    H, I = 1536, 8960
    w_gate_up, w_down = torch.zeros(2 * I, H, dtype=torch.bfloat16), torch.zeros(H, I, dtype=torch.bfloat16)
    for R in (1, 16):
        fused_mlp.fused_mlp(torch.zeros(R, H, dtype=torch.bfloat16), w_gate_up, w_down,
                            residual=torch.zeros(R, H, dtype=torch.bfloat16), tile=fused_mlp.DECODE_TILE)
    assert len(compiled["fused_mlp_partials"].built) == 1
    assert len(compiled["reduce_partials"].built) == 2            # the reduce's column block: 32 at 1 row, 64 at 16
