"""The rollout decoder's MoE experts (hybridrl/models/moe.py) on one GPU: is the grouped-GEMM path CUDA-graph safe,
does the engine decode an MoE model under CUDA graphs with the tokens it gets eagerly, and how fast are the experts.

1. Graph check: the experts forward (route + grouped GEMMs) of a Qwen3-30B-A3B layer shape (128 experts of 768,
   hidden 2048, top 8, bf16) is captured in a CUDA graph and replayed on new inputs; the replay must equal an eager
   forward on those inputs.
2. Engine check: tiny random Qwen3-MoE and Mixtral models in bf16 decode greedily with CUDA graphs and with
   enforce_eager; the tokens must be equal (and graphs must have been captured).
3. Timing, per token count T: the 'grouped_mm' and 'sorted' backends, and HF's Qwen3MoeExperts with its
   'grouped_mm' and 'eager' (per-expert loop) implementations on the same weights, with the largest difference
   of HF's outputs from ours.

  PYTHONPATH=. python benchmarks/moe_experts.py [--tokens 8 64 256 1024 4096] [--out moe_experts.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "rollout"))
from rollout_helpers import tiny_hf_model  # noqa: E402

from hybridrl.models.moe import Experts, grouped_mm_available, route  # noqa: E402
from hybridrl.rollout.config import EngineConfig  # noqa: E402
from hybridrl.rollout.engine import LLMEngine  # noqa: E402
from hybridrl.rollout.sampling_params import SamplingParams  # noqa: E402

E, H, I, K = 128, 2048, 768, 8  # Qwen3-30B-A3B's MoE layer


def layer(dev):
    torch.manual_seed(0)
    experts = Experts(E, H, I).to(dev)
    experts.gate_up_proj.data = (torch.randn(E, 2 * I, H, device=dev) * 0.02).bfloat16()
    experts.down_proj.data = (torch.randn(E, H, I, device=dev) * 0.02).bfloat16()
    gate = (torch.randn(E, H, device=dev) * 0.02).bfloat16()
    return experts, gate


def graph_check(experts, gate, dev, T) -> bool:
    def forward(x):
        weights, ids = route(x @ gate.T, K, True, False)
        return experts(x, ids, weights)

    x = torch.randn(T, H, device=dev).bfloat16()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream
        forward(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = forward(x)
    x.copy_(torch.randn(T, H, device=dev).bfloat16())
    graph.replay()
    return torch.equal(out, forward(x))


def engine_check(kind: str) -> dict:
    model = tiny_hf_model(kind)
    prompts, result = [[1, 2, 3, 4, 5], [7, 8, 9], [10] * 11], {}
    for eager in (True, False):
        config = EngineConfig(dtype=torch.bfloat16, block_size=16, num_kv_blocks=64, max_num_seqs=8,
                              max_num_batched_tokens=256, enforce_eager=eager)
        engine = LLMEngine(model.config, config, device="cuda")
        engine.wake_up(("weights",))
        engine.load_weights(model.state_dict().items())
        engine.wake_up(("kv_cache",))
        outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
        result["eager" if eager else "graphs"] = [o.outputs[0].token_ids for o in outs]
        if not eager:
            result["graphs_captured"] = sorted(engine.runner.graphs)
        engine.sleep()
    return {"tokens_equal": result["eager"] == result["graphs"], "graphs_captured": result["graphs_captured"]}


def ms(module, inputs, repeat=20) -> float:
    for _ in range(3):
        module(*inputs)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeat):
        module(*inputs)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeat * 1e3


def timings(experts, gate, dev, tokens) -> list[dict]:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    hf = {}
    for impl in ("grouped_mm", "eager"):
        cfg = transformers.Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K)
        cfg._experts_implementation = impl
        hf[impl] = Qwen3MoeExperts(cfg).to(dev, torch.bfloat16)
        hf[impl].gate_up_proj.data, hf[impl].down_proj.data = experts.gate_up_proj.data, experts.down_proj.data
    rows = []
    for T in tokens:
        x = torch.randn(T, H, device=dev).bfloat16()
        weights, ids = route(x @ gate.T, K, True, False)
        inputs, row = (x, ids, weights), {"tokens": T}
        for backend in ("grouped_mm", "sorted"):
            experts.backend = backend
            row[f"ms_{backend}"] = ms(experts, inputs)
        experts.backend = "auto"
        ours = experts(x, ids, weights).float()
        for impl, module in hf.items():
            row[f"ms_hf_{impl}"] = ms(module, inputs)
            row[f"max_diff_hf_{impl}"] = (module(x, ids, weights).float() - ours).abs().max().item()
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[8, 64, 256, 1024, 4096])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    dev = torch.device("cuda")
    experts, gate = layer(dev)
    report = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
              "grouped_mm_bf16": grouped_mm_available(dev, torch.bfloat16),
              "graph_replay_equals_eager": {T: graph_check(experts, gate, dev, T) for T in (64, 256)},
              "engine": {kind: engine_check(kind) for kind in ("qwen3_moe", "mixtral")}}
    print(json.dumps(report), flush=True)
    report["timings"] = timings(experts, gate, dev, args.tokens)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
