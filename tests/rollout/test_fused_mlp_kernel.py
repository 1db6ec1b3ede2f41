"""The fused decode MLP (hybridrl/models/fused_mlp.py, timed by benchmarks/decode_fused_mlp.py) on CPU under the Triton interpreter (TRITON_INTERPRET=1; run in a child
pytest by tests/test_triton_interpreted.py): the fused MLP against the current path's torch numerics, the partial
slabs against the down projection of the h the kernel computed, and the reduce's order and roundings. On the CPU the
tl.dot operands go in as fp32 (the interpreter mishandles bf16 ones; the upcast is exact), so what these tests leave
to the GPU run is the bf16 tensor-core dot itself and the timing path."""

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed: the fused MLP kernels cannot run")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import decode_fused_mlp as D  # noqa: E402

from hybridrl.models import fused_mlp as M  # noqa: E402

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="the kernels run on CPU only under the Triton interpreter: TRITON_INTERPRET=1")

BF16_ULP = 2.0 ** -7  # the widest relative spacing of bf16 values (8 significant bits)
# (H, I, tile): I a multiple of block_i; I=80 with block_i=32 (the last slice holds 16 live columns); H=48 with
# block_k = block_h = 32 (the last K chunk and the last output chunk half live)
SHAPES = {"H64_I96": (64, 96, M.Tile(block_i=32, block_k=32, block_h=32)),
          "H64_I80": (64, 80, M.Tile(block_i=32, block_k=64, block_h=64)),
          "H48_I96": (48, 96, M.Tile(block_i=32, block_k=32, block_h=32))}
ROWS = [1, 3, 8, 16, 20]  # 20: tl.dot's rows padded to 32, the rest to 16


def inputs(rows, h, i, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, h, generator=g).bfloat16()
    w_gate_up = (torch.randn(2 * i, h, generator=g) / h ** 0.5).bfloat16()
    w_down = (torch.randn(h, i, generator=g) / i ** 0.5).bfloat16()
    residual = torch.randn(rows, h, generator=g).bfloat16()
    return x, w_gate_up, w_down, residual


def reference_h(x, w_gate_up):
    g, u = F.linear(x, w_gate_up).float().chunk(2, dim=-1)
    return (F.silu(g).bfloat16().float() * u).bfloat16()


def assert_bf16_close(got, ref, min_equal=0.95):
    """Within one bf16 ulp of the largest reference magnitude, and mostly bit-equal: the kernel and torch round at
    the same points and differ only in fp32 summation order, which moves a rounding now and then (a wrong rounding
    point or mask would show in far more elements, or by far more)."""
    got, ref = got.float(), ref.float()
    err = (got - ref).abs().max().item()
    assert err <= BF16_ULP * ref.abs().max().item(), err
    assert (got == ref).float().mean().item() >= min_equal


@interpreted
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_fused_mlp_matches_the_current_path(shape, rows, with_residual):
    h, i, tile = SHAPES[shape]
    x, w_gate_up, w_down, residual = inputs(rows, h, i)
    res = residual if with_residual else None
    got = M.fused_mlp(x, w_gate_up, w_down, res, tile)
    assert got.shape == (rows, h) and got.dtype == torch.bfloat16
    assert_bf16_close(got, M.reference_mlp(x, w_gate_up, w_down, res))
    assert D.check(x, w_gate_up, w_down, residual, tile) <= D.TOL  # the benchmark's own gate passes too


@interpreted
@pytest.mark.parametrize("rows", [3, 20])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_partial_slab_is_its_slice_of_the_down_projection(shape, rows):
    """Slab p is h[:, slice p] @ w_down[:, slice p].T for the kernel's own h (which matches torch's rounded h), and
    the slabs sum to the whole down projection: a dropped, doubled or shifted slice fails."""
    h, i, tile = SHAPES[shape]
    x, w_gate_up, w_down, _ = inputs(rows, h, i, seed=1)
    h_out = torch.zeros(rows, i, dtype=torch.bfloat16)
    part = M.mlp_partials(x, w_gate_up, w_down, tile, h_out=h_out)
    slabs = -(-i // tile.block_i)
    assert part.shape == (slabs, rows, h) and part.dtype == torch.float32
    assert_bf16_close(h_out, reference_h(x, w_gate_up), min_equal=0.98)
    hf, wf = h_out.double(), w_down.double()
    for p in range(slabs):
        cols = slice(p * tile.block_i, min((p + 1) * tile.block_i, i))
        torch.testing.assert_close(part[p].double(), hf[:, cols] @ wf[:, cols].T, rtol=1e-5, atol=1e-6)
    full = hf @ wf.T
    torch.testing.assert_close(part.double().sum(0), full, rtol=1e-5, atol=1e-6)
    assert (full - part[1:].double().sum(0)).abs().max() > 1e-2  # what a missing slab would look like


@interpreted
@pytest.mark.parametrize("rows", [1, 2])
def test_the_reduce_rounds_the_sum_then_adds_the_residual_bit_for_bit(rows):
    """Integer partials sum exactly in fp32 in any order, so the output must equal bf16(sum) and, with a residual,
    bf16(residual + bf16(sum)) bit for bit; 300 slabs take three BLOCK_P chunks (the last partial), H=48 two column
    blocks (the last partial)."""
    g = torch.Generator().manual_seed(2)
    P, H = 300, 48
    part = torch.randint(-64, 65, (P, rows, H), generator=g).float()
    residual = (torch.rand(rows, H, generator=g) * 2 - 1).bfloat16()
    exact = part.double().sum(0)
    assert exact.abs().max() < 2 ** 24
    y = exact.float().bfloat16()
    out = M.sum_partials(part)
    assert torch.equal(out, y)
    out_res = M.sum_partials(part, residual)
    two_roundings = (residual.float() + y.float()).bfloat16()
    assert torch.equal(out_res, two_roundings)
    # the test tells the current path's two roundings from one (sums of ~9 significant bits, residuals below 1)
    assert not torch.equal(two_roundings, (residual.double() + exact).float().bfloat16())


@interpreted
def test_fused_mlp_is_deterministic():
    h, i, tile = SHAPES["H64_I80"]
    x, w_gate_up, w_down, residual = inputs(8, h, i, seed=3)
    part = M.mlp_partials(x, w_gate_up, w_down, tile)
    assert torch.equal(M.sum_partials(part, residual), M.sum_partials(part, residual))
    assert torch.equal(M.fused_mlp(x, w_gate_up, w_down, residual, tile),
                       M.fused_mlp(x, w_gate_up, w_down, residual, tile))


def test_the_wrapper_refuses_what_the_kernel_cannot_serve():
    x, w_gate_up, w_down, _ = inputs(2, 64, 96)
    with pytest.raises(ValueError, match="at most"):
        M.fused_mlp(torch.zeros(M.MAX_ROWS + 1, 64, dtype=torch.bfloat16), w_gate_up, w_down)
    with pytest.raises(ValueError, match="power of two"):
        M.fused_mlp(x, w_gate_up, w_down, tile=M.Tile(block_i=24))
    with pytest.raises(ValueError, match="w_gate_up"):
        M.fused_mlp(x, w_gate_up[:-1], w_down)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, main() runs the benchmark")
def test_main_without_a_gpu_lists_the_tiles(capsys):
    D.main([])
    out = capsys.readouterr().out
    assert "needs a CUDA GPU" in out and out.count("block_i") == len(D.TILES)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows", [1, 8, 16])
def test_fused_mlp_on_a_gpu_at_the_1_5b_shape(rows):
    """The compiled kernels (bf16 tensor-core dots) at Qwen2.5-1.5B's MLP shape, the engine's tile and the sweep's
    first and last (the benchmark compiles them all), against the current path's torch numerics (the benchmark's own
    check) and bit for bit against themselves."""
    h, i = 1536, 8960
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, h, device="cuda", generator=g).bfloat16()
    w_gate_up = (torch.randn(2 * i, h, device="cuda", generator=g) * (D.WEIGHT_SCALE / h ** 0.5)).bfloat16()
    w_down = (torch.randn(h, i, device="cuda", generator=g) * (D.WEIGHT_SCALE / i ** 0.5)).bfloat16()
    residual = torch.randn(rows, h, device="cuda", generator=g).bfloat16()
    for tile in (M.DECODE_TILE, M.Tile(**D.TILES[0]), M.Tile(**D.TILES[-1])):
        assert D.check(x, w_gate_up, w_down, residual, tile) <= D.TOL
        assert torch.equal(M.fused_mlp(x, w_gate_up, w_down, residual, tile),
                           M.fused_mlp(x, w_gate_up, w_down, residual, tile))


def tiny_mlp(h, i):
    from types import SimpleNamespace

    from hybridrl.models.decoder import MLP

    mlp = MLP(SimpleNamespace(hidden_size=h, intermediate_size=i), tp_group=None).to(torch.bfloat16)
    g = torch.Generator().manual_seed(4)
    mlp.gate_up_proj.weight.data.copy_(torch.randn(2 * i, h, generator=g) / h ** 0.5)
    mlp.down_proj.weight.data.copy_(torch.randn(h, i, generator=g) / i ** 0.5)
    return mlp


@interpreted
@pytest.mark.parametrize("rows,fused_expected", [(1, True), (M.ENGINE_MAX_ROWS, True), (M.ENGINE_MAX_ROWS + 1, False)])
def test_the_decoders_mlp_runs_fused_at_decode_batch_and_matches_the_torch_path(monkeypatch, rows, fused_expected):
    """models/decoder.py's MLP on the fused path: the one-kernel MLP up to ENGINE_MAX_ROWS rows, silu_mul between
    two GEMMs above; either way the torch path's result within bf16 rounding."""
    calls = []
    real = M.fused_mlp
    monkeypatch.setattr(M, "fused_mlp", lambda *a, **k: calls.append(k.get("tile")) or real(*a, **k))
    mlp = tiny_mlp(64, 96)
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(5)).bfloat16()
    got = mlp(x, use_fused=True)
    assert calls == ([M.DECODE_TILE] if fused_expected else [])
    assert_bf16_close(got, mlp(x, use_fused=False), min_equal=0.9)


@interpreted
def test_fused_mlp_switched_off_takes_the_unfused_kernels(monkeypatch):
    monkeypatch.setenv("HYBRIDRL_FUSED_MLP", "0")
    monkeypatch.setattr(M, "fused_mlp", lambda *a, **k: pytest.fail("HYBRIDRL_FUSED_MLP=0 ran the fused MLP"))
    mlp = tiny_mlp(64, 96)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(6)).bfloat16()
    assert_bf16_close(mlp(x, use_fused=True), mlp(x, use_fused=False), min_equal=0.9)


def test_serves_only_16_bit_contiguous_decode_batches():
    w_gu, w_d = torch.zeros(2 * 96, 64, dtype=torch.bfloat16), torch.zeros(64, 96, dtype=torch.bfloat16)
    x = torch.zeros(8, 64, dtype=torch.bfloat16)
    assert M.serves(x, w_gu, w_d) == (M.triton is not None)
    assert not M.serves(x[:0], w_gu, w_d)
    assert not M.serves(torch.zeros(M.ENGINE_MAX_ROWS + 1, 64, dtype=torch.bfloat16), w_gu, w_d)
    assert not M.serves(x.float(), w_gu.float(), w_d.float())
    assert not M.serves(x, w_gu, w_d.float())
    assert not M.serves(torch.zeros(64, 8, dtype=torch.bfloat16).T, w_gu, w_d)


@pytest.mark.parametrize("intermediate,sms,want", [(8960, 132, True), (18944, 132, False), (18944 // 2, 132, True),
                                                   (8960, 66, False), (128 * 132, 132, True), (128 * 132 + 1, 132, False)])
def test_the_engine_takes_the_fused_mlp_where_its_slices_fit_one_wave(intermediate, sms, want):
    """1.5B: 70 slices of 128 columns on 132 SMs; a 7B at TP = 1: 148, more than one wave; at TP = 2: 74."""
    assert M.one_wave(intermediate, sms) == want
