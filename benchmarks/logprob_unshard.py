"""Log-prob pass: FSDP shards all-gathered once per micro-batch vs once per pass (`log_prob_unshard_once`).

Spawns --ranks processes (NCCL on GPUs, gloo on CPU), builds the FSDP2 actor exactly as the trainer does
(`build_fsdp_model` + `DataParallelPPOActor`), and times `compute_log_prob` over the same random batch for each
micro-batch size, with the shards kept unsharded for the pass and without. Reports seconds (mean over --reps after
a warm-up pass), all-gathers issued, peak allocated memory on CUDA, and checks the log-probs are identical.

  python benchmarks/logprob_unshard.py --preset qwen2.5-1.5b --ranks 2 --out OUT.json       # GPUs
  python benchmarks/logprob_unshard.py --tiny --ranks 2 --device cpu --out OUT.json         # CPU (gloo)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch(rows, prompt_len, resp_len, vocab, seed):
    from hybridrl.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab, (rows, prompt_len), generator=g)
    responses = torch.randint(3, vocab, (rows, resp_len), generator=g)
    attn = torch.ones(rows, prompt_len + resp_len, dtype=torch.long)
    return DataProto.from_dict({"responses": responses, "input_ids": torch.cat([prompts, responses], 1),
                                "attention_mask": attn, "position_ids": attn.cumsum(1) - 1},
                               meta_info={"temperature": 1.0})


class _AllGatherCounter:
    """Counts FSDP2's all-gathers (it calls one of these two, depending on the torch version)."""

    NAMES = ("all_gather_single", "all_gather_into_tensor")

    def __init__(self):
        self.count, self.saved = 0, {n: getattr(dist, n) for n in self.NAMES if hasattr(dist, n)}
        for name, orig in self.saved.items():
            setattr(dist, name, self._wrap(orig))

    def _wrap(self, orig):
        def call(*a, **k):
            self.count += 1
            return orig(*a, **k)
        return call


def _worker(rank, world, port, a, model_dir, out_file):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    cuda = a.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    from hybridrl.config import load_config
    from hybridrl.training import DataParallelPPOActor, build_fsdp_model, build_training_mesh
    from hybridrl.training.fsdp import FSDPDtypes, ModelSource

    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    mesh = build_training_mesh(world, device_type=a.device)
    model = build_fsdp_model(ModelSource(str(model_dir), {}, False), FSDPDtypes("fp32", "bf16", "fp32"), mesh, device,
                             use_varlen_attention=True)
    actor = DataParallelPPOActor(load_config().actor_rollout_ref.actor, model, use_remove_padding=True)
    vocab = model.config.vocab_size
    data = _batch(a.rows, a.prompt_len, a.response_len, vocab, seed=rank).to(device)
    counter = _AllGatherCounter()
    rows = []
    for micro in [int(m) for m in a.micro.split(",")]:
        ref = None
        for once in (False, True):
            data.meta_info.update(micro_batch_size=micro, unshard_once=once)
            actor.compute_log_prob(data)  # warm-up
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated() if cuda else 0
            counter.count = 0
            t0 = time.perf_counter()
            for _ in range(a.reps):
                lp, _ = actor.compute_log_prob(data)
            if cuda:
                torch.cuda.synchronize()
            secs = (time.perf_counter() - t0) / a.reps
            if ref is None:
                ref = lp
            row = {"micro_batch_size": micro, "unshard_once": once, "seconds": secs,
                   "all_gathers": counter.count // a.reps, "same_log_probs": bool(torch.equal(lp, ref))}
            if cuda:
                row["peak_extra_gb"] = (torch.cuda.max_memory_allocated() - before) / 1e9
            rows.append(row)
    if rank == 0:
        Path(out_file).write_text(json.dumps(rows))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen2.5-1.5b")
    ap.add_argument("--tiny", action="store_true", help="a small random model (hidden 256, 8 layers) instead")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--rows", type=int, default=16, help="rows per rank")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--response-len", type=int, default=256)
    ap.add_argument("--micro", default="1,4,16")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        if a.tiny:
            from hybridrl.assets.tiny_model import build_tiny_model

            build_tiny_model(model_dir, layers=8, hidden=256, heads=4)
            model_name = "tiny (qwen2, hidden 256, 8 layers)"
        else:
            from hybridrl.assets.tiny_model import write_size_preset

            write_size_preset(model_dir, a.preset)
            model_name = a.preset
        out_rows = Path(tmp) / "rows.json"
        mp.spawn(_worker, args=(a.ranks, _free_port(), a, model_dir, out_rows), nprocs=a.ranks, join=True)
        rows = json.loads(out_rows.read_text())
    facts = {"torch": torch.__version__, "host_cpus": os.cpu_count(), "device": a.device}
    if a.device == "cuda":
        facts.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count())
    result = {"benchmark": "logprob_unshard", "command": "python " + " ".join(sys.argv), "device": facts,
              "model": model_name, "workload": vars(a), "rows": rows}
    for micro in sorted({r["micro_batch_size"] for r in rows}):
        each, once = (next(r for r in rows if r["micro_batch_size"] == micro and r["unshard_once"] == o)
                      for o in (False, True))
        print(f"micro {micro:>3}: {each['seconds']:.3f} s ({each['all_gathers']} all-gathers) -> "
              f"{once['seconds']:.3f} s ({once['all_gathers']}) once per pass = {each['seconds'] / once['seconds']:.2f}x, "
              f"same log-probs: {once['same_log_probs']}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
