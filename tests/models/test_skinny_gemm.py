"""The fused skinny decode GEMMs (models/skinny_gemm.py) against plain PyTorch: on CPU under the Triton interpreter
(TRITON_INTERPRET=1, PYTHONPATH=/work/triton-pkg:.) in fp32 and fp16 (the interpreter's bf16 tl.dot is wrong), and
in bf16 on a GPU against the current decode path (fused.add_rmsnorm / fused.silu_mul + F.linear), eager and inside
a CUDA graph (`-m gpu`).

The GEMM input must be exactly the tensor the current path feeds F.linear: with an identity weight the output is
that input, compared bit for bit (the RMSNorm up to its fp32 variance-sum order). The products are then checked
against an fp64 matmul of the torch path's input: fp32 to 2e-6 of the largest |y| (the fp32 summation order), fp16
to one fp16 ulp of each value (the output's rounding) plus 1e-4 of the largest |y| (a rare 1-ulp input from the
variance order)."""

import os

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed: the skinny GEMMs cannot run")
from hybridrl.models import skinny_gemm as S  # noqa: E402

interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="the kernels run on CPU only under the Triton interpreter: TRITON_INTERPRET=1")
EPS = 1e-6
H, QKV, INTER = 1536, 2048, 8960       # Qwen2.5-1.5B: hidden, fused q|k|v rows, intermediate (gate_up: 2 x 8960)
TOL = {torch.float32: dict(rtol=1e-5, scale=2e-6), torch.float16: dict(rtol=2**-10, scale=1e-4)}


def _inputs(M, K, N, dtype, seed, bias=True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(M, K, generator=g).to(dtype)
    r = torch.randn(M, K, generator=g).to(dtype)
    nw = (1 + 0.1 * torch.randn(K, generator=g)).to(dtype)
    w = (torch.randn(N, K, generator=g) / K**0.5).to(dtype)
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    return h, r, nw, w, b


def torch_norm(h, r, nw):
    """The current path's RMSNorm in the model dtype (decoder.RMSNorm after the residual add): -> (x, h + r)."""
    s = h if r is None else h + r
    sf = s.float()
    normed = (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + EPS)).to(s.dtype)
    return nw * normed, s


def torch_silu_mul(gu):
    g, u = gu.chunk(2, -1)
    return F.silu(g) * u


def check_product(y, x, w, b=None):
    """y against fp64 x @ w.T (+ b), tolerances by dtype; -> (max |err| / max |ref|, max |err| / |ref| where > 0)."""
    ref = x.double() @ w.double().T
    if b is not None:
        ref = ref + b.double()
    tol = TOL[y.dtype]
    big = ref.abs().max().item()
    torch.testing.assert_close(y.double(), ref, rtol=tol["rtol"], atol=tol["scale"] * big)
    err = (y.double() - ref).abs()
    return err.max().item() / big, (err / ref.abs().clamp_min(1e-30)).max().item()


@interpreted
@pytest.mark.parametrize("M", [1, 3, 8, 16, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("residual", [True, False])
def test_norm_matmul_small_odd_shape(M, dtype, split, residual):
    """K 200 and N 72: partial K blocks, a partial N tile, rows not a power of two; the bias; split K."""
    h, r, nw, w, b = _inputs(M, 200, 72, dtype, seed=M)
    r = r if residual else None
    r_before = None if r is None else r.clone()
    y, new_res = S.norm_matmul(h, r, nw, EPS, w, b, tile=dict(block_n=32, block_k=32, split_k=split))
    x, s = torch_norm(h, r, nw)
    if residual:
        assert torch.equal(new_res, s) and torch.equal(r, r_before)   # a fresh tensor; residual untouched
    else:
        assert new_res is h
    check_product(y, x, w, b)


@interpreted
@pytest.mark.parametrize("M", [1, 3, 8, 16, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("split", [1, 4])
def test_silu_mul_matmul_small_odd_shape(M, dtype, split):
    g = torch.Generator().manual_seed(M)
    gu = (2 * torch.randn(M, 2 * 200, generator=g)).to(dtype)
    w = (torch.randn(72, 200, generator=g) / 200**0.5).to(dtype)
    y = S.silu_mul_matmul(gu, w, tile=dict(block_n=16, block_k=32, split_k=split))
    check_product(y, torch_silu_mul(gu), w)


@interpreted
@pytest.mark.parametrize("op,N,M", [("qkv", QKV, m) for m in (1, 3, 8, 16, 64)]
                         + [("gate_up", 2 * INTER, m) for m in (1, 16, 64)])
def test_norm_matmul_1p5b_shapes(op, N, M):
    """qkv (with bias) at every row count, gate_up (the widest, slowest under the interpreter) at three; the default
    tiles (TILES); fp16 throughout, fp32 at 3 rows; residual None at 8."""
    for dtype in (torch.float16, torch.float32) if M == 3 else (torch.float16,):
        h, r, nw, w, b = _inputs(M, H, N, dtype, seed=N + M, bias=op == "qkv")
        r = None if M == 8 else r
        y, new_res = S.norm_matmul(h, r, nw, EPS, w, b)
        x, s = torch_norm(h, r, nw)
        assert torch.equal(new_res, s)
        check_product(y, x, w, b)


@interpreted
@pytest.mark.parametrize("M", [1, 3, 8, 16, 64])
def test_silu_mul_matmul_1p5b_down(M):
    """down_proj: K 8,960 in 5 splits (the default tile); fp16, and fp32 at 3 rows."""
    for dtype in (torch.float16, torch.float32) if M == 3 else (torch.float16,):
        g = torch.Generator().manual_seed(M)
        gu = (2 * torch.randn(M, 2 * INTER, generator=g)).to(dtype)
        w = (torch.randn(H, INTER, generator=g) / INTER**0.5).to(dtype)
        check_product(S.silu_mul_matmul(gu, w), torch_silu_mul(gu), w)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gemm_input_is_the_current_paths_input(dtype):
    """Identity weights: y is the normalised (or SiLU-and-mul) input itself, bit for bit as fused.add_rmsnorm and
    fused.silu_mul (interpreted too) compute it (fp32 RMSNorm: to its variance-sum order, a few ulps), and as the
    torch formulas do to a few fp32 ulps / one fp16 ulp in under 1% of the values (the variance order; torch's own
    SiLU)."""
    from hybridrl.models import fused

    ulps = dict(rtol=5e-7, atol=0) if dtype == torch.float32 else dict(rtol=2**-10, atol=0)
    for M in (1, 5, 17):
        h, r, nw, _, _ = _inputs(M, 200, 1, dtype, seed=M)
        eye = torch.eye(200, dtype=dtype)
        y, _ = S.norm_matmul(h, r, nw, EPS, eye, tile=dict(block_n=64, block_k=64, split_k=2))
        fx, _ = fused.add_rmsnorm(h, r.clone(), nw, EPS)
        x, _ = torch_norm(h, r, nw)
        if dtype == torch.float16:
            assert torch.equal(y, fx)
        torch.testing.assert_close(y, fx, rtol=5e-7, atol=0)
        torch.testing.assert_close(y, x, **ulps)
        assert (y != x).float().mean() < 0.01 or dtype == torch.float32
        gu = (3 * torch.randn(M, 400, generator=torch.Generator().manual_seed(M))).to(dtype)
        y = S.silu_mul_matmul(gu, eye, tile=dict(block_n=32, block_k=64, split_k=3))
        assert torch.equal(y, fused.silu_mul(gu))
        torch.testing.assert_close(y, torch_silu_mul(gu), **ulps)
        assert (y != torch_silu_mul(gu)).float().mean() < 0.01 or dtype == torch.float32


@interpreted
def test_split_k_is_deterministic_and_resets_its_counters():
    """Same bits run to run; split K agrees with one pass to fp32 summation order; every counter is back to 0."""
    h, r, nw, w, b = _inputs(8, 640, 96, torch.float32, seed=7)
    one, _ = S.norm_matmul(h, r, nw, EPS, w, b, tile=dict(block_n=32, block_k=64, split_k=1))
    split = [S.norm_matmul(h, r, nw, EPS, w, b, tile=dict(block_n=32, block_k=64, split_k=5))[0] for _ in range(2)]
    assert torch.equal(split[0], split[1])
    torch.testing.assert_close(split[0], one, rtol=1e-5, atol=1e-5)
    gu = torch.randn(8, 1280)
    ys = [S.silu_mul_matmul(gu, w, tile=dict(block_n=16, block_k=64, split_k=s)) for s in (1, 10, 10)]
    assert torch.equal(ys[1], ys[2])
    torch.testing.assert_close(ys[1], ys[0], rtol=1e-5, atol=1e-5)
    assert int(S._counters[torch.device("cpu")].abs().sum()) == 0


def test_tiles_and_limits():
    """The table's shapes give >= 120 programs for 132 SMs; the default rule reproduces the table at <= 16 rows;
    splits never leave a split empty; more than 64 rows and mismatched weights are refused."""
    for (op, bucket, N, K), t in S.TILES.items():
        per, splits = S.splits_of(K, t["block_k"], t["split_k"])
        assert splits == t["split_k"] and (splits - 1) * per < S._cdiv(K, t["block_k"])
        programs = S._cdiv(N, t["block_n"]) * splits
        assert programs >= 120, (op, bucket, N, K, programs)
        if bucket == 16:
            assert S.default_tile(op, 8, N, K) == t, (op, N, K)
    assert S.splits_of(8960, 128, 11) == (7, 10)   # 11 splits of 70 k-blocks would leave one empty: 10 are launched
    assert S.m_bucket(1) == 16 and S.m_bucket(17) == 32 and S.m_bucket(64) == 64
    with pytest.raises(ValueError, match="rows"):
        S.m_bucket(65)
    with pytest.raises(ValueError, match="weight"):
        S.silu_mul_matmul(torch.zeros(2, 10), torch.zeros(3, 4))
    y, res = S.norm_matmul(torch.zeros(0, 8), None, torch.ones(8), EPS, torch.zeros(4, 8))
    assert y.shape == (0, 4) and res.shape == (0, 8)


# ----------------------------------------------------------------------------------------------- GPU (bf16)
SHAPES_GPU = {"1.5B": (1536, 2048, 8960), "7B": (3584, 4608, 18944)}   # hidden, qkv rows, intermediate


def _gpu_inputs(M, K, N, seed, bias):
    g = torch.Generator("cuda").manual_seed(seed)
    dev, dt = "cuda", torch.bfloat16
    return (torch.randn(M, K, device=dev, generator=g).to(dt), torch.randn(M, K, device=dev, generator=g).to(dt),
            (1 + 0.1 * torch.randn(K, device=dev, generator=g)).to(dt),
            (0.02 * torch.randn(N, K, device=dev, generator=g)).to(dt),
            torch.randn(N, device=dev, generator=g).to(dt) if bias else None)


def _close_bf16(y, ref):
    """Same GEMM input, another fp32 summation order: within one bf16 rounding of each value (+ 1e-3 of the
    largest, for values near 0)."""
    torch.testing.assert_close(y.float(), ref.float(), rtol=2**-7, atol=1e-3 * ref.float().abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["1.5B", "7B"])
@pytest.mark.parametrize("M", [1, 4, 8, 16, 33, 64])
def test_gpu_matches_the_torch_path_bf16(model, M):
    from hybridrl.models import fused

    hid, qkv, inter = SHAPES_GPU[model]
    for N, bias in ((qkv, True), (2 * inter, False)):
        h, r, nw, w, b = _gpu_inputs(M, hid, N, seed=M, bias=bias)
        x, rr = fused.add_rmsnorm(h, r.clone(), nw, EPS)
        y, new_res = S.norm_matmul(h, r, nw, EPS, w, b)
        assert torch.equal(new_res, rr)
        _close_bf16(y, F.linear(x, w, b))
        y0, res0 = S.norm_matmul(h, None, nw, EPS, w, b)
        assert res0 is h
        _close_bf16(y0, F.linear(fused.add_rmsnorm(h, None, nw, EPS)[0], w, b))
    gu = 2 * torch.randn(M, 2 * inter, device="cuda", dtype=torch.bfloat16)
    wd = 0.02 * torch.randn(hid, inter, device="cuda", dtype=torch.bfloat16)
    _close_bf16(S.silu_mul_matmul(gu, wd), F.linear(fused.silu_mul(gu), wd))


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8, 64])
def test_gpu_gemm_input_is_the_fused_kernels_output_bf16(M):
    """Identity weights on the GPU: SiLU-and-mul bit for bit as fused.silu_mul, RMSNorm as fused.add_rmsnorm up to
    the variance-sum order (< 1% of the values, each by one bf16 ulp): the `_round` emulation holds compiled."""
    from hybridrl.models import fused

    K = 1536
    h, r, nw, _, _ = _gpu_inputs(M, K, 1, seed=3, bias=False)
    eye = torch.eye(K, device="cuda", dtype=torch.bfloat16)
    y, _ = S.norm_matmul(h, r, nw, EPS, eye)
    x, _ = fused.add_rmsnorm(h, r.clone(), nw, EPS)
    assert (y != x).float().mean().item() < 0.01
    torch.testing.assert_close(y.float(), x.float(), rtol=2**-7, atol=0)
    gu = 3 * torch.randn(M, 2 * K, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(S.silu_mul_matmul(gu, eye), fused.silu_mul(gu))


@pytest.mark.gpu
def test_gpu_cuda_graph_replays_the_eager_bits():
    """Captured in one CUDA graph (1.5B qkv, gate_up with a forced split, down with its default split): every
    replay on new inputs gives the eager call's bits, and eager calls repeat their bits (deterministic split K)."""
    M, split_tile = 8, dict(block_n=64, block_k=128, split_k=3, num_warps=4, num_stages=4)
    h, r, nw, wq, bq = _gpu_inputs(M, H, QKV, seed=1, bias=True)
    wg = _gpu_inputs(1, H, 2 * INTER, seed=2, bias=False)[3]
    wd = 0.02 * torch.randn(H, INTER, device="cuda", dtype=torch.bfloat16)
    gu = torch.randn(M, 2 * INTER, device="cuda", dtype=torch.bfloat16)

    def step():
        return (*S.norm_matmul(h, r, nw, EPS, wq, bq), S.norm_matmul(h, r, nw, EPS, wg, tile=split_tile)[0],
                S.silu_mul_matmul(gu, wd))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()   # compiles, allocates the split counters
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for i in range(3):
        for t in (h, r, gu):
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        eager = [step() for _ in range(2)]
        for got, e0, e1 in zip(outs, *eager):
            assert torch.equal(e0, e1) and torch.equal(got, e0), i


@interpreted
@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])   # qkv bias; q/k norms after the fused qkv
def test_engine_decodes_through_the_skinny_path_to_hf_greedy(kind, monkeypatch):
    """The decoder's fused forward with the skinny GEMMs on (fp32, CPU, interpreter): they are called, and the
    engine's greedy tokens equal HF's and the path without them."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "rollout"))
    from rollout_helpers import hf_greedy, tiny_hf_model

    import hybridrl.rollout.triton_decode as td
    from hybridrl.rollout.config import EngineConfig
    from hybridrl.rollout.engine import LLMEngine
    from hybridrl.rollout.sampling_params import SamplingParams

    monkeypatch.setenv("HYBRIDRL_FUSED", "force")
    monkeypatch.setattr(td, "num_sms", lambda index=0: 132)   # the Triton sampler sizes its splits by the SMs
    model = tiny_hf_model(kind)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [10] * 37]
    tokens, calls = {}, []
    real = S.norm_matmul
    monkeypatch.setattr(S, "norm_matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    for mode in ("0", "force"):
        monkeypatch.setenv(S.ENV, mode)
        engine = LLMEngine(model.config, EngineConfig(dtype=torch.float32, block_size=16, num_kv_blocks=64,
                                                      max_num_seqs=64, max_num_batched_tokens=256,
                                                      enforce_eager=True), device="cpu")
        engine.wake_up(("weights",))
        engine.load_weights(model.state_dict().items())
        engine.wake_up(("kv_cache",))
        outs = engine.generate(prompts, SamplingParams(n=2, temperature=0, max_tokens=6, ignore_eos=True))
        tokens[mode] = [c.token_ids for o in outs for c in o.outputs]
        assert (len(calls) > 0) == (mode == "force"), (mode, len(calls))
    assert tokens["force"] == tokens["0"] == [hf_greedy(model, p, 6) for p in prompts for _ in range(2)]


@interpreted
def test_benchmark_logic_dry_run(tmp_path, monkeypatch):
    """benchmarks/decode_fused_gemm.py end to end on CPU (fp16, tiny shapes, a plain loop for the CUDA graph): the
    checks, both modes' JSON, and a sweep's best tiles fed back through --tiles."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import decode_fused_gemm as B

    def fake_graph(fn, copies, calls, reps):
        for c in range(calls):
            fn(copies[c % len(copies)])
        return 1.0 + len(copies) * 0.01

    monkeypatch.setattr(B, "DEVICE", "cpu")
    monkeypatch.setattr(B, "DTYPE", torch.float16)
    monkeypatch.setattr(B, "graph_time_us", fake_graph)
    monkeypatch.setattr(B, "copy_bandwidth", lambda: 4e12)
    monkeypatch.setattr(B, "gemm_shapes", lambda name: {"qkv": (48, 64), "o": (64, 64), "gate_up": (160, 64),
                                                         "down": (64, 80)})
    monkeypatch.setattr(B, "SWEEP_BN", (16, 32))
    monkeypatch.setattr(B, "SWEEP_SPLITS", (1, 2, 3))
    monkeypatch.setattr(B, "SWEEP_WARPS_STAGES", [(4, 3), (2, 2)])
    monkeypatch.setattr(S, "TILES", dict(S.TILES))
    sweep = B.main(["--sweep", "--models", "tiny", "--rows", "3", "--layers", "2", "--out", str(tmp_path / "s.json")])
    assert set(sweep["best_tiles"]) == {"norm,16,48,64", "norm,16,160,64", "silu,16,64,80"}
    assert all(t.get("us") or t.get("refused") for s in sweep["shapes"] for t in s["tiles"])
    res = B.main(["--models", "tiny", "--rows", "1,3,17", "--layers", "2", "--tiles", str(tmp_path / "s.json"),
                  "--out", str(tmp_path / "b.json")])
    assert json.loads((tmp_path / "b.json").read_text())["command"].startswith("PYTHONPATH=. python ")
    assert len(res["pairs"]) == 9 and len(res["layers_total"]) == 3
    assert all(p["check"]["new_residual_exact"] and p["check"]["rel_err"] < 2e-3 for p in res["pairs"])
    assert res["tiles"]["silu,16,64,80"]["block_n"] == sweep["best_tiles"]["silu,16,64,80"]["block_n"]
