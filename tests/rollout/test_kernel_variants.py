"""The rollout's Triton kernels compile at most twice (a single pass, or split with a merge) for all CUDA-graph
batch sizes together: what varies with the batch (the context splits of the paged decode attention, the vocabulary
chunks of the sampler) reaches them as runtime arguments, not as compile-time constants, so a fresh machine's first
rollout compiles each kernel once or twice instead of once per bucket. Launches are recorded, not run (no GPU or
interpreter needed)."""

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from hybridrl.rollout import triton_decode, triton_sample  # noqa: E402
from hybridrl.rollout.model_runner import GRAPH_BATCH_SIZES  # noqa: E402


class Recorder:
    """Stands in for a @triton.jit kernel: records each launch's compile-time arguments (its keywords) and its
    positional (runtime) arguments by the kernel's parameter names."""

    def __init__(self, kernel):
        self.names, self.launches = kernel.arg_names, []
        # runtime arguments Triton compiles no separate kernel for (it would for a value of 1 or a multiple of 16)
        self.unspecialised = {self.names[a] if isinstance(a, int) else a for a in kernel.do_not_specialize}

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((tuple(sorted(kwargs.items())), dict(zip(self.names, args))))
        return launch

    def compile_keys(self):
        """One per kernel Triton would compile: the constexprs, how each specialised integer argument is
        specialised (equal to 1, a multiple of 16) and the tensors' dtypes."""
        keys = set()
        for constexprs, args in self.launches:
            ints = tuple((n, v == 1, v % 16 == 0) for n, v in args.items()
                         if isinstance(v, int) and not isinstance(v, bool) and n not in self.unspecialised)
            dtypes = tuple(str(v.dtype) for v in args.values() if isinstance(v, torch.Tensor))
            keys.add((constexprs, ints, dtypes))
        return keys

    def values(self, name):
        return {v[name] for _, v in self.launches}


def test_paged_decode_attention_compiles_two_kernels_for_all_graph_buckets(monkeypatch):
    decode = Recorder(triton_decode._paged_decode_kernel)
    merge = Recorder(triton_decode._merge_splits_kernel)
    monkeypatch.setattr(triton_decode, "_paged_decode_kernel", decode)
    monkeypatch.setattr(triton_decode, "_merge_splits_kernel", merge)
    monkeypatch.setattr(triton_decode, "num_sms", lambda index: 132)
    N, K, D, page, blocks = 12, 2, 128, 16, 272        # Qwen2.5-1.5B's heads; 4,352-token block tables
    k_cache = torch.zeros(1, page, K, D, dtype=torch.bfloat16)
    for B in GRAPH_BATCH_SIZES:
        q = torch.zeros(B, N, D, dtype=torch.bfloat16)
        bt = torch.zeros(B, blocks, dtype=torch.int32)
        triton_decode.paged_decode_triton(q, k_cache, k_cache, bt, torch.zeros(B, dtype=torch.int32), D ** -0.5,
                                          num_splits=triton_decode.decode_splits(B, K, blocks * page, 132))
    assert len(decode.values("SPLITS")) >= 5              # the buckets do ask for different split counts ...
    assert "SPLITS" in decode.unspecialised and "SPLITS" in merge.unspecialised
    keys = decode.compile_keys()                          # ... and the decode kernel compiles twice for all of them:
    assert {dict(k[0])["DIRECT"] for k in keys} == {True, False}  # single pass (big batches), partials (split)
    assert len(keys) == 2
    pads = {dict(k[0])["SLOTS_PAD"] for k in merge.compile_keys()}
    assert len(merge.compile_keys()) == len(pads)         # the merge once per power-of-two slot tile, not per count
    assert len(pads) < len(merge.values("SPLITS"))


def test_sampler_compiles_two_kernels_and_one_merge_for_all_graph_buckets(monkeypatch):
    sample, merge = Recorder(triton_sample._sample_kernel), Recorder(triton_sample._merge_kernel)
    monkeypatch.setattr(triton_sample, "_sample_kernel", sample)
    monkeypatch.setattr(triton_sample, "_merge_kernel", merge)
    monkeypatch.setattr(triton_decode, "num_sms", lambda index: 132)
    V = 151936
    for B in GRAPH_BATCH_SIZES:
        logits = torch.zeros(B, V, dtype=torch.bfloat16)
        triton_sample.sample_plain(logits, torch.zeros(B), all_greedy=True)
    assert len(sample.values("SPLITS")) >= 5 and len(sample.values("CHUNK")) >= 5
    assert {"SPLITS", "CHUNK"} <= sample.unspecialised and "SPLITS" in merge.unspecialised
    assert {dict(k[0])["SPLIT"] for k in sample.compile_keys()} == {True, False}
    assert len(sample.compile_keys()) == 2                # one chunk, or several
    assert len(merge.compile_keys()) == 1 < len(merge.values("SPLITS"))


def test_fused_mlp_compiles_once_across_its_row_buckets(monkeypatch):
    from hybridrl.models import fused_mlp

    partials, reduce = Recorder(fused_mlp.fused_mlp_partials), Recorder(fused_mlp.reduce_partials)
    monkeypatch.setattr(fused_mlp, "fused_mlp_partials", partials)
    monkeypatch.setattr(fused_mlp, "reduce_partials", reduce)
    monkeypatch.setattr(fused_mlp.torch.Tensor, "is_cuda", property(lambda t: True))   # the GPU's launch options
    H, I = 1536, 8960
    w_gate_up, w_down = torch.zeros(2 * I, H, dtype=torch.bfloat16), torch.zeros(H, I, dtype=torch.bfloat16)
    buckets = [b for b in GRAPH_BATCH_SIZES if b <= fused_mlp.ENGINE_MAX_ROWS]
    for R in buckets:
        fused_mlp.fused_mlp(torch.zeros(R, H, dtype=torch.bfloat16), w_gate_up, w_down,
                            tile=fused_mlp.DECODE_TILE)
    assert partials.values("R") == set(buckets)
    assert "R" in partials.unspecialised and "R" in reduce.unspecialised
    assert len(partials.compile_keys()) == 1
    assert len(reduce.compile_keys()) == len({fused_mlp.reduce_block_h(R, H) for R in buckets}) <= 2
