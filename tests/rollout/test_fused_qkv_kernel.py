"""benchmarks/decode_fused_qkv.py's two kernels (residual add + RMSNorm + qkv GEMV as K-split partials; their reduce
with the bias, RoPE, the K/V cache store and the new residual) on CPU under the Triton interpreter (TRITON_INTERPRET=1;
run in a child pytest by tests/test_triton_interpreted.py): against the torch path the engine falls back to
(`reference_qkv`) and the current kernels (fused.add_rmsnorm, F.linear, fused.rope_store_kv, interpreted too), the
partial slabs against the GEMV of the normed rows, and the reduce's roundings bit for bit. On the CPU the tl.dot
operands go in as fp32 (the interpreter mishandles bf16 ones; the upcast is exact), so what these tests leave to the
GPU run is the bf16 tensor-core dot, cuBLAS's own bias epilogue, the compiled reductions' order and the timing path."""

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed: the fused qkv kernels cannot run")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import decode_fused_qkv as Q  # noqa: E402

from hybridrl.models.decoder import RMSNorm  # noqa: E402
from hybridrl.models.rope import apply_rope  # noqa: E402

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="the kernels run on CPU only under the Triton interpreter: TRITON_INTERPRET=1")

BF16_ULP = 2.0 ** -7  # the widest relative spacing of bf16 values (8 significant bits)
EPS = 1e-6
BLOCKS, BLOCK_SIZE = 5, 4  # the paged caches: 20 slots, rows land on a random subset
# (H, N, K, D, tile). H64: 4 column blocks x 2 splits of 32. H48: H not a multiple of block_k (split 1 holds 16 live
# columns). H80_N3_K1: 80 qkv columns, the second column block of 64 only 16 live; 3 splits of 32, the last 16 live.
# Few heads: the interpreter runs the reduce's (rows x heads) programs at ~12 ms each.
SHAPES = {"H64_N4_K2": (64, 4, 2, 16, Q.Tile(block_n=32, block_k=32, split_k=2)),
          "H48_N2_K1": (48, 2, 1, 16, Q.Tile(block_n=32, block_k=32, split_k=2)),
          "H80_N3_K1": (80, 3, 1, 16, Q.Tile(block_n=64, block_k=16, split_k=3))}
ROWS = [1, 3, 8, 16]
# every shape and row count with a bias (Qwen2's qkv), a few without (Llama's, Qwen3's)
CASES = ([(s, r, True) for s in SHAPES for r in ROWS]
         + [("H64_N4_K2", 3, False), ("H64_N4_K2", 16, False), ("H80_N3_K1", 8, False)])


def inputs(rows, shape, bias=True, seed=0):
    H, N, K, D, _ = SHAPES[shape] if isinstance(shape, str) else shape
    g = torch.Generator().manual_seed(seed)
    nqkv = (N + 2 * K) * D
    cos, sin = Q.rope_tables(rows, D, "cpu", seed=seed)
    return dict(h=torch.randn(rows, H, generator=g).bfloat16(), residual=torch.randn(rows, H, generator=g).bfloat16(),
                norm_w=(1 + 0.2 * torch.randn(H, generator=g)).bfloat16(), eps=EPS,
                w_qkv=(torch.randn(nqkv, H, generator=g) / H ** 0.5).bfloat16(),
                b_qkv=torch.randn(nqkv, generator=g).bfloat16() if bias else None, cos=cos, sin=sin,
                k_cache=torch.randn(BLOCKS, BLOCK_SIZE, K, D, generator=g).bfloat16(),  # untouched slots keep these
                v_cache=torch.randn(BLOCKS, BLOCK_SIZE, K, D, generator=g).bfloat16(),
                slots=torch.randperm(BLOCKS * BLOCK_SIZE, generator=g)[:rows])


def run(fn, inp, **kw):
    """fn on copies of the buffers it writes -> (q, new residual, k cache, v cache, the residual buffer passed)."""
    mine = dict(inp, **{k: inp[k].clone() for k in ("residual", "k_cache", "v_cache") if inp[k] is not None})
    q, res = fn(**mine, **kw)
    return q, res, mine["k_cache"], mine["v_cache"], mine["residual"]


def assert_bf16_close(got, ref, min_equal=0.95):
    """Within one bf16 ulp of the largest reference magnitude, and mostly bit-equal: the kernels and torch round at
    the same points and differ only in fp32 summation order (the variance, the GEMV), which moves a rounding now and
    then (a wrong rounding point, mask, head or slot would show in far more elements, or by far more)."""
    got, ref = got.float(), ref.float()
    err = (got - ref).abs().max().item()
    assert err <= BF16_ULP * ref.abs().max().item(), err
    assert (got == ref).float().mean().item() >= min_equal


def untouched(cache, before, slots):
    keep = torch.ones(cache.shape[0] * cache.shape[1], dtype=torch.bool)
    keep[slots] = False
    return torch.equal(cache.flatten(0, 1)[keep], before.flatten(0, 1)[keep])


@interpreted
@pytest.mark.parametrize("shape,rows,bias", CASES)
def test_fused_qkv_matches_the_torch_path(shape, rows, bias):
    inp = inputs(rows, shape, bias)
    q, res, kc, vc, res_buf = run(Q.fused_qkv, inp, tile=SHAPES[shape][4])
    q_ref, res_ref, kc_ref, vc_ref, _ = run(Q.reference_qkv, inp)
    H, N, K, D, _ = SHAPES[shape]
    assert q.shape == (rows, N, D) and q.dtype == torch.bfloat16
    assert res is res_buf  # the new residual is written in place, as add_rmsnorm does
    assert torch.equal(res, res_ref)  # one fp32 add, one rounding: exact
    assert_bf16_close(q, q_ref)
    slots = inp["slots"]
    assert_bf16_close(kc[slots // BLOCK_SIZE, slots % BLOCK_SIZE], kc_ref[slots // BLOCK_SIZE, slots % BLOCK_SIZE])
    assert_bf16_close(vc[slots // BLOCK_SIZE, slots % BLOCK_SIZE], vc_ref[slots // BLOCK_SIZE, slots % BLOCK_SIZE])
    assert untouched(kc, inp["k_cache"], slots) and untouched(vc, inp["v_cache"], slots)


@interpreted
@pytest.mark.parametrize("shape,rows", [("H64_N4_K2", 3), ("H48_N2_K1", 16), ("H80_N3_K1", 8)])
def test_fused_qkv_matches_the_current_kernels(shape, rows):
    """Against the engine's current kernels (fused.add_rmsnorm, F.linear with the bias, fused.rope_store_kv), and the
    benchmark's own gate on them passes."""
    inp = inputs(rows, shape, seed=1)
    tile = SHAPES[shape][4]
    got = run(Q.fused_qkv, inp, tile=tile)
    cur = run(Q.current_qkv, inp)
    assert torch.equal(got[1], cur[1])
    for a, b in zip(got[:4], cur[:4]):
        assert_bf16_close(a, b)
    layer = (inp["norm_w"], inp["w_qkv"], inp["b_qkv"], inp["k_cache"], inp["v_cache"])
    assert Q.check(inp["h"], inp["residual"], layer, EPS, inp["cos"], inp["sin"], inp["slots"], tile) <= Q.TOL
    assert torch.equal(layer[3], inp["k_cache"])  # check() works on copies


@interpreted
@pytest.mark.parametrize("rows", [1, 8])
def test_the_first_layer_without_a_residual_normalises_h_itself(rows):
    inp = inputs(rows, "H48_N2_K1", seed=2) | {"residual": None}
    q, res, kc, vc, _ = run(Q.fused_qkv, inp, tile=SHAPES["H48_N2_K1"][4])
    q_ref, res_ref, kc_ref, vc_ref, _ = run(Q.reference_qkv, inp)
    assert res is inp["h"] and res_ref is inp["h"]
    assert_bf16_close(q, q_ref)
    assert_bf16_close(kc, kc_ref)
    assert_bf16_close(vc, vc_ref)


def normed_rows(inp):
    """models/decoder.py's RMSNorm of bf16(h + residual), times its weight: what the GEMV multiplies."""
    norm = RMSNorm(inp["h"].shape[1], EPS)
    norm.weight.data = inp["norm_w"]
    return norm(inp["h"] + inp["residual"])


@interpreted
@pytest.mark.parametrize("rows", [3, 16])
@pytest.mark.parametrize("shape,tile", [(s, SHAPES[s][4]) for s in SHAPES]
                         + [("H64_N4_K2", Q.Tile(block_n=16, block_k=32, split_k=4))])  # splits 2 and 3 empty
def test_each_partial_slab_is_its_split_of_the_gemv(shape, tile, rows):
    """Slab s is y[:, split s] @ w[:, split s].T for the kernel's own normed rows y (which match torch's RMSNorm),
    and the slabs sum to the whole GEMV: a dropped, doubled or shifted split fails. Reading the partials never
    writes the residual."""
    inp = inputs(rows, shape, seed=3)
    H = inp["h"].shape[1]
    res_before = inp["residual"].clone()
    y = torch.zeros(rows, H, dtype=torch.bfloat16)
    part = Q.qkv_partials(inp["h"], inp["residual"], inp["norm_w"], EPS, inp["w_qkv"], tile, y_out=y)
    assert torch.equal(inp["residual"], res_before)
    assert part.shape == (tile.split_k, rows, inp["w_qkv"].shape[0]) and part.dtype == torch.float32
    assert_bf16_close(y, normed_rows(inp), min_equal=0.98)
    yd, wd = y.double(), inp["w_qkv"].double()
    kps = Q.k_per_split(H, tile)
    for s in range(tile.split_k):
        cols = slice(min(s * kps, H), min((s + 1) * kps, H))
        torch.testing.assert_close(part[s].double(), yd[:, cols] @ wd[:, cols].T, rtol=1e-5, atol=1e-6)
    full = yd @ wd.T
    torch.testing.assert_close(part.double().sum(0), full, rtol=1e-5, atol=1e-6)
    assert (full - part[1:].double().sum(0)).abs().max() > 1e-2  # what a missing split would look like


@interpreted
@pytest.mark.parametrize("bias", [True, False])
def test_the_reduce_adds_the_bias_before_one_rounding_and_ropes_bit_for_bit(bias):
    """Integer partials sum exactly in fp32 in any order, so with the bias added in fp32 and rounded once (F.linear's
    numerics) the outputs must equal apply_rope / index_copy_ of bf16(sum + bias) bit for bit; 5 slabs (S_PAD 8, 3
    masked). Sums of up to ~11 bits, which bf16 rounds: the test tells one rounding from two
    (bf16(bf16(sum) + bias))."""
    g = torch.Generator().manual_seed(4)
    rows, (_, N, K, D, _) = 2, SHAPES["H64_N4_K2"]
    nqkv = (N + 2 * K) * D
    part = torch.randint(-400, 401, (5, rows, nqkv), generator=g).float()
    inp = inputs(rows, "H64_N4_K2", bias=bias, seed=4)
    b = inp["b_qkv"]
    exact = part.sum(0)  # exact in fp32
    qkv = (exact + b.float()).bfloat16() if bias else exact.bfloat16()
    if bias:
        assert not torch.equal(qkv, (exact.bfloat16().float() + b.float()).bfloat16())
    kc, vc, res = inp["k_cache"].clone(), inp["v_cache"].clone(), inp["residual"].clone()
    q = Q.reduce_rope_store(part, b, inp["h"], res, inp["cos"], inp["sin"], kc, vc, inp["slots"])
    q_ref, k_ref, v_ref = Q._split_heads(qkv, kc)
    assert torch.equal(q, apply_rope(q_ref, inp["cos"], inp["sin"]))
    kc_ref, vc_ref = inp["k_cache"].clone(), inp["v_cache"].clone()
    kc_ref.view(-1, K, D).index_copy_(0, inp["slots"], apply_rope(k_ref, inp["cos"], inp["sin"]))
    vc_ref.view(-1, K, D).index_copy_(0, inp["slots"], v_ref.contiguous())
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)
    assert torch.equal(res, inp["h"] + inp["residual"])


@interpreted
def test_fused_qkv_is_deterministic():
    inp = inputs(8, "H80_N3_K1", seed=5)
    tile = SHAPES["H80_N3_K1"][4]
    a, b = run(Q.fused_qkv, inp, tile=tile), run(Q.fused_qkv, inp, tile=tile)
    for x, y in zip(a[:4], b[:4]):
        assert torch.equal(x, y)
    pa = Q.qkv_partials(inp["h"], inp["residual"], inp["norm_w"], EPS, inp["w_qkv"], tile)
    assert torch.equal(pa, Q.qkv_partials(inp["h"], inp["residual"], inp["norm_w"], EPS, inp["w_qkv"], tile))


def test_the_wrappers_refuse_what_the_kernels_cannot_serve():
    inp = inputs(2, "H64_N4_K2")
    args = [inp[k] for k in ("h", "residual", "norm_w", "eps", "w_qkv")]
    with pytest.raises(ValueError, match="at most"):
        Q.qkv_partials(torch.zeros(Q.MAX_ROWS + 1, 64, dtype=torch.bfloat16), None, *args[2:])
    with pytest.raises(ValueError, match="power of two"):
        Q.qkv_partials(*args, Q.Tile(block_n=24))
    with pytest.raises(ValueError, match="split_k"):
        Q.qkv_partials(*args, Q.Tile(split_k=0))
    with pytest.raises(ValueError, match="w_qkv"):
        Q.qkv_partials(*args[:4], inp["w_qkv"][:, :-1])
    with pytest.raises(ValueError, match="w_qkv"):
        Q.qkv_partials(*args[:4], inp["w_qkv"].float())
    with pytest.raises(ValueError, match="residual"):
        Q.qkv_partials(args[0], args[1][:1], *args[2:])
    with pytest.raises(ValueError, match="norm weight"):
        Q.qkv_partials(*args[:2], args[2][:-1], *args[3:])
    with pytest.raises(ValueError, match="16-bit"):
        Q.qkv_partials(args[0].float(), None, *args[2:])
    part = torch.zeros(2, 2, 128)
    rest = {k: inp[k] for k in ("cos", "sin", "k_cache", "v_cache", "slots")}

    def reduce(part=part, b=inp["b_qkv"], **kw):
        return Q.reduce_rope_store(part, b, inp["h"], inp["residual"], **(rest | kw))

    with pytest.raises(ValueError, match="heads"):  # 120 columns are not whole heads of 16
        reduce(torch.zeros(2, 2, 120))
    with pytest.raises(ValueError, match="heads"):  # 64 columns: no room for a q head beside 2 + 2 kv heads
        reduce(torch.zeros(2, 2, 64), None)
    with pytest.raises(ValueError, match="alike"):
        reduce(v_cache=inp["v_cache"][:, :2])
    with pytest.raises(ValueError, match="contiguous"):
        reduce(k_cache=inp["k_cache"].transpose(0, 1).contiguous().transpose(0, 1),
               v_cache=inp["v_cache"].transpose(0, 1).contiguous().transpose(0, 1))
    with pytest.raises(ValueError, match="head_dim"):
        reduce(k_cache=torch.zeros(5, 4, 2, 12, dtype=torch.bfloat16), v_cache=torch.zeros(5, 4, 2, 12))
    with pytest.raises(ValueError, match="cos"):
        reduce(cos=inp["cos"][:, :8])
    with pytest.raises(ValueError, match="slots"):
        reduce(slots=inp["slots"].float())
    with pytest.raises(ValueError, match="bias"):
        reduce(b=inp["b_qkv"][:-1])
    with pytest.raises(ValueError, match="rows"):
        reduce(part=torch.zeros(2, 3, 128))


@pytest.mark.parametrize("model", ["1.5B", "7B"])
def test_the_sweep_fills_one_to_four_waves_without_empty_splits(model):
    H, N, K, D = Q.model_shape(model)
    nqkv = (N + 2 * K) * D
    tiles = Q.sweep(H, nqkv)
    assert 8 <= len(tiles) <= 32
    for t in tiles:
        kps = Q.k_per_split(H, t)
        assert kps % t.block_k == 0 and (t.split_k - 1) * kps < H <= t.split_k * kps
        assert Q.SMS <= -(-nqkv // t.block_n) * t.split_k <= 4 * Q.SMS


def test_k_per_split_rounds_up_to_whole_chunks():
    assert Q.k_per_split(1536, Q.Tile(block_k=64, split_k=8)) == 192
    assert Q.k_per_split(48, Q.Tile(block_k=32, split_k=2)) == 32
    assert Q.k_per_split(64, Q.Tile(block_k=32, split_k=4)) == 32  # splits 2 and 3 empty


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, main() runs the benchmark")
@pytest.mark.parametrize("model", ["1.5B", "7B"])
def test_main_without_a_gpu_lists_the_tiles(capsys, model):
    Q.main(["--model", model])
    out = capsys.readouterr().out
    H, N, K, D = Q.model_shape(model)
    assert "needs a CUDA GPU" in out and out.count("block_n") == len(Q.sweep(H, (N + 2 * K) * D))


@interpreted
def test_the_benchmarks_row_loop_runs_on_cpu(monkeypatch):
    """measure_rows (the per-row-count body of main) on the CPU under the interpreter, the CUDA graph timing replaced
    by one call: every variant runs, a good tile is checked and becomes the best, a refused tile is recorded with its
    error and not timed."""
    monkeypatch.setattr(Q, "DEVICE", "cpu")
    calls = []
    monkeypatch.setattr(Q, "graph_replay_us", lambda fn, reps: (calls.append(fn) or 2.0, fn()))
    good, bad = Q.Tile(block_n=32, block_k=32, split_k=2), Q.Tile(block_n=24, block_k=32, split_k=2)
    rec = Q.measure_rows(2, 64, 4, 2, 16, [good, bad], 2, EPS, 1.0)
    assert rec["current_us_per_layer"] == 1.0 and rec["fused_us_per_layer"] == 1.0
    assert rec["best_tile"] == Q.asdict(good)
    assert set(rec["current_parts_us_per_layer"]) == {"add_rmsnorm", "qkv_linear", "rope_store_kv"}
    assert set(rec["fused_parts_us_per_layer"]) == {"norm_qkv_partials", "qkv_reduce_rope_store"}
    assert all(v == 1.0 for v in rec["current_parts_us_per_layer"].values())
    assert all(v == 1.0 for v in rec["fused_parts_us_per_layer"].values())
    ok, refused = rec["tiles"]
    assert ok["rel_err"] <= Q.TOL and ok["q_finite"] and "error" not in ok
    assert "power of two" in refused["error"] and "us_per_layer" not in refused
    assert len(calls) == 1 + 3 + 1 + 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows", [1, 8, 16])
def test_fused_qkv_on_a_gpu_at_the_1_5b_shape(rows):
    """The compiled kernels (bf16 tensor-core dots) at Qwen2.5-1.5B's shape, the sweep's first, middle and last tile
    (the benchmark compiles them all), against the current kernels (the benchmark's own check) and bit for bit
    against themselves."""
    H, N, K, D = Q.model_shape("1.5B")
    layers, slots = Q.layer_inputs(H, N, K, D, rows, 1)
    cos, sin = Q.rope_tables(rows, D, "cuda")
    h = torch.randn(rows, H, device="cuda").bfloat16()
    residual = torch.randn(rows, H, device="cuda").bfloat16()
    norm_w, w, b, kc, vc = layers[0]
    tiles = Q.sweep(H, (N + 2 * K) * D)
    for tile in (tiles[0], tiles[len(tiles) // 2], tiles[-1]):
        assert Q.check(h, residual, layers[0], EPS, cos, sin, slots, tile) <= Q.TOL
        a = Q.fused_qkv(h, residual.clone(), norm_w, EPS, w, b, cos, sin, kc.clone(), vc.clone(), slots, tile)
        c = Q.fused_qkv(h, residual.clone(), norm_w, EPS, w, b, cos, sin, kc.clone(), vc.clone(), slots, tile)
        assert torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])


def test_reference_qkv_is_the_torch_formula():
    """reference_qkv spelled out with plain torch ops (h + residual, RMSNorm, addmm, rope, index_copy_), so the
    oracle itself is pinned: F.linear with a bias on the CPU rounds once."""
    inp = inputs(3, "H64_N4_K2", seed=6)
    q, res, kc, vc, _ = run(Q.reference_qkv, inp)
    x = inp["h"] + inp["residual"]
    xf = x.float()
    y = inp["norm_w"] * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).bfloat16()
    qkv = (y.double() @ inp["w_qkv"].double().T + inp["b_qkv"].double()).float().bfloat16()
    assert_bf16_close(F.linear(y, inp["w_qkv"], inp["b_qkv"]), qkv, min_equal=0.98)
    qr, _, _ = Q._split_heads(qkv, inp["k_cache"])
    assert torch.equal(res, x)
    assert_bf16_close(q, apply_rope(qr, inp["cos"], inp["sin"]), min_equal=0.98)
