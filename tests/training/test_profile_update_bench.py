"""benchmarks/profile_update.py on the tiny model on CPU: it times and profiles the real actor update, one model
serves both configurations of one kind, and checkpointing is really toggled (recompute runs each layer twice)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_update.py"


@pytest.fixture(scope="module")
def bench():
    """The script as a module (registered in sys.modules while it loads: its dataclass needs that)."""
    spec = importlib.util.spec_from_file_location("profile_update", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_config_spec_is_checked(bench):
    cfg = bench.UpdateConfig.parse("lora64:nockpt:4")
    assert (cfg.lora_rank, cfg.checkpointing, cfg.micro, cfg.forward_equivalents()) == (64, False, 4, 2)
    assert bench.UpdateConfig.parse("full:ckpt:16").forward_equivalents() == 4
    keep = bench.UpdateConfig.parse("lora64:keep4:32")
    assert (keep.checkpointing, keep.kept_layers, keep.forward_equivalents(28)) == (True, 4, 2 + 24 / 28)
    assert bench.UpdateConfig.parse("lora8:ckpt:4:peft").lora_forward == "peft"
    assert bench.UpdateConfig.parse("lora8:ckpt:4").lora_forward == "fused"
    for bad in ("lora:ckpt:4", "full:recompute:4", "full:keep0:4", "full:keepx:4", "full:ckpt:0", "full:ckpt:4:peft", "lora8:ckpt:4:fast",
                "lora8:ckpt"):
        with pytest.raises(ValueError):
            bench.UpdateConfig.parse(bad)


def test_busy_seconds_merges_overlapping_kernels(bench):
    assert bench.busy_seconds([(0, 10), (5, 20), (30, 40)]) == pytest.approx(30e-9)


def test_cpu_run_times_profiles_and_toggles_checkpointing(bench, tiny_model_dir, tmp_path):
    lora = importlib.util.find_spec("peft") is not None
    kind, peft = ("lora8", ":peft") if lora else ("full", "")
    out = tmp_path / "update.json"
    rows = 8
    result = bench.main(["--device", "cpu", "--preset", f"dir:{tiny_model_dir}", "--rows", str(rows),
                         "--prompt-len", "12", "--response-len", "12", "--repeat", "1",
                         "--configs", f"{kind}:ckpt:4,{kind}:nockpt:2{peft},{kind}:keep1:4", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["command"].endswith(f"{kind}:ckpt:4,{kind}:nockpt:2{peft},{kind}:keep1:4 --out {out}")
    assert "forward-equivalent" in result["flop_assumptions"]
    assert list(result["models"]) == [kind]   # the second configuration toggled checkpointing on the same model
    ckpt, nockpt = result["configs"][f"{kind}:ckpt:4"], result["configs"][f"{kind}:nockpt:2{peft}"]
    assert (ckpt["lora_forward"], nockpt["lora_forward"]) == (("fused", "peft") if lora else (None, None))
    for entry, micro, recompute in ((ckpt, 4, True), (nockpt, 2, False)):
        assert "error" not in entry, entry.get("traceback")
        assert entry["micro_batches"] == rows // micro
        assert entry["update_s"] > 0 and entry["tokens_per_s"] > 0 and entry["tflops"] > 0
        assert entry["s_per_micro_batch"] == pytest.approx(entry["update_s"] / (rows // micro))
        assert entry["is_gradient_checkpointing"] is recompute
        assert entry["first_layer_forwards_per_micro_batch"] == (2.0 if recompute else 1.0)
        window = entry["profile"]["micro_batch_window"]
        # the window skips the first micro-batch and holds at most two
        assert window["micro_batches"] == min(2, rows // micro - 1) and window["wall_s"] > 0
        assert entry["profile"]["optimizer_step"]["wall_s"] > 0
    assert ckpt["forward_equivalents"] == nockpt["forward_equivalents"] + 1
    keep = result["configs"][f"{kind}:keep1:4"]
    assert "error" not in keep, keep.get("traceback")
    layers = keep["layers"]
    assert (ckpt["recomputed_layers"], nockpt["recomputed_layers"], keep["recomputed_layers"]) == (layers, 0, layers - 1)
    assert keep["first_layer_forwards_per_micro_batch"] == 2.0   # the first layer still recomputes, the last not
    assert keep["forward_equivalents"] == pytest.approx(nockpt["forward_equivalents"] + (layers - 1) / layers)


def test_cpu_run_with_shared_prompts_counts_each_prompt_once_per_micro_batch(bench, tiny_model_dir, tmp_path):
    result = bench.main(["--device", "cpu", "--preset", f"dir:{tiny_model_dir}", "--rows", "8", "--n", "4",
                         "--prompt-len", "12", "--response-len", "6", "--repeat", "1", "--use-prefix-grouper", "true",
                         "--configs", "full:nockpt:4", "--out", str(tmp_path / "u.json")])
    entry = result["configs"]["full:nockpt:4"]
    assert "error" not in entry, entry.get("traceback")
    assert result["models"]["full"]["use_prefix_grouper"] is True
    assert entry["decoder_tokens"] == 2 * (12 + 4 * 6)     # two micro-batches of one 4-row group each
    batch = bench.synthetic_batch(8, 12, 6, 300, n=4)
    ids = batch.batch["input_ids"]
    assert (ids[:4, :12] == ids[0, :12]).all() and not (ids[4, :12] == ids[0, :12]).all()


def test_moe_kernels_and_ops_get_their_own_categories(bench):
    grouped = ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<"
               "cute::tuple<int, int, int> >, cutlass::gemm::collective::CollectiveMma<...KernelPtrArrayTmaWarp...")
    dense_gemm = "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>>"
    # CUTLASS names carry their tile copies' types (the H200 profile's grouped GEMM), FlashAttention's cutlass::
    mangled = ("_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9xINS_4gemm6kernel13GemmUniversal"
               "INS5_17GroupProblemShapeIN4cute5tupleIJiiiEEEEENS8_9SM90_TMA_LOADENS8_6Copy_AtomINS8_SM75_U32x4")
    flash = "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<cutlass::bf16>>"
    for name, moe, dense in ((grouped, "moe_gemm", "gemm"), (dense_gemm, "gemm", "gemm"), (mangled, "moe_gemm", "gemm"),
                             (flash, "attention", "attention"),
                             ("void at::native::direct_copy_kernel_cuda", "fsdp_copy", "fsdp_copy"),
                             ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>", "moe_dispatch",
                              "other"),
                             ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<>>",
                              "moe_dispatch", "other"),
                             ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "fsdp_copy",
                              "fsdp_copy"),
                             ("void at::native::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>",
                              "other", "other")):
        assert (bench.kernel_category(name, moe=True), bench.kernel_category(name)) == (moe, dense), name


def test_cpu_run_of_an_moe_model_separates_the_experts_work(bench, tmp_path):
    from _training_tiny import make_tiny_moe_dir

    model = make_tiny_moe_dir(tmp_path / "moe", "qwen3_moe")
    configs = ["full:ckpt:tok64"] + (["lora8:keep1:tok64"] if importlib.util.find_spec("peft") else [])
    result = bench.main(["--device", "cpu", "--preset", f"dir:{model}", "--rows", "8", "--n", "4", "--prompt-len",
                         "16", "--response-len", "16", "--repeat", "1", "--configs", ",".join(configs),
                         "--out", str(tmp_path / "u.json")])
    facts = result["models"]["full"]
    # 2 MoE layers of 8 experts (gate_up 2 * 32 x 64, down 64 x 32 each), top 2: a quarter of them active
    assert facts["moe"] is True and facts["expert_params"] == 2 * 8 * 3 * 32 * 64
    full_decoder = sum(p.numel() for n, p in bench_params(model) if "embed_tokens" not in n and "lm_head" not in n)
    assert facts["decoder_params"] == full_decoder - facts["expert_params"] * 3 // 4
    for name in configs:
        entry = result["configs"][name]
        assert "error" not in entry, entry.get("traceback")
        window = entry["profile"]["micro_batch_window"]
        moe = window["moe_op_s"]
        assert moe["time"] == "cpu" and window["top_ops"] and window["top_ops"][0]["cpu_ms"] > 0
        assert moe["s_by_category"]["moe_gemm"] > 0 and moe["s_by_category"]["moe_dispatch"] > 0
        ops = {o["op"]: o["category"] for o in moe["ops"]}
        assert ops["aten::topk"] == ops["aten::sort"] == ops["aten::index"] == "moe_dispatch"
        assert "moe_gemm" in ops.values()


def bench_params(model_dir):
    import torch
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(model_dir))
    return list(model.named_parameters())
