"""Split/collect rules of the dispatch modes, without Ray."""

import os

import numpy as np
import pytest
import torch

from hybridrl.controller import Dispatch, Worker, init_distributed, make_mesh_dispatch, register
from hybridrl.controller.dispatch import collect_dataproto, get_dispatch_spec, split_dataproto
from hybridrl.protocol import DataProto


def rows(n: int) -> DataProto:
    return DataProto.from_dict({"ids": torch.arange(n)}, {"tag": [f"r{i}" for i in range(n)]})


@pytest.mark.parametrize("n,chunks", [(5, 2), (7, 3), (4, 2), (1, 2)])
def test_split_then_collect_roundtrip_drops_padding(n, chunks):
    parts, layout = split_dataproto(rows(n), chunks, "m")
    assert len(parts) == chunks and len({len(p) for p in parts}) == 1
    assert sum(layout.real) == n
    out = collect_dataproto(parts, layout, "m")
    assert out.batch["ids"].tolist() == list(range(n))
    assert list(out.non_tensor_batch["tag"]) == [f"r{i}" for i in range(n)]


def test_collect_unpads_outputs_expanded_n_times():
    parts, layout = split_dataproto(rows(5), 2, "gen")  # chunks [0,1,2] and [3,4,pad]
    outs = [p.repeat(3, interleave=True) for p in parts]  # a rollout with n=3 samples a prompt
    out = collect_dataproto(outs, layout, "gen")
    assert out.batch["ids"].tolist() == [i for i in range(5) for _ in range(3)]


def test_collect_refuses_what_it_cannot_unpad():
    parts, layout = split_dataproto(rows(5), 2, "gen")
    with pytest.raises(ValueError, match="not a multiple"):
        collect_dataproto([parts[0], parts[1].slice(0, 2)], layout, "gen")
    with pytest.raises(ValueError, match="padded"):
        collect_dataproto([{"loss": 1.0}, {"loss": 2.0}], layout, "update")
    _, even = split_dataproto(rows(4), 2, "update")
    assert collect_dataproto([{"loss": 1.0}, {"loss": 2.0}], even, "update") == [{"loss": 1.0}, {"loss": 2.0}]


def test_split_empty_batch_names_method():
    with pytest.raises(ValueError, match="compute_log_prob"):
        split_dataproto(DataProto.from_dict({"ids": torch.zeros(0)}), 2, "compute_log_prob")


def test_register_marks_and_validates():
    @register(dispatch_mode=make_mesh_dispatch("rollout"), blocking=False)
    def gen(self, data):
        return data

    spec = get_dispatch_spec(gen)
    assert spec.mode.mesh_name == "rollout" and spec.blocking is False
    assert get_dispatch_spec(register(Dispatch.ONE_TO_ALL)(lambda s: 1)).blocking is True
    with pytest.raises(ValueError, match="dispatch_mode"):
        register(dispatch_mode="dp")
    with pytest.raises(ValueError, match="mesh_name"):
        make_mesh_dispatch("")


def test_worker_reads_env_and_validates_dispatch_info(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")  # Ray pinned one GPU: it is cuda:0 here
    w = Worker()
    assert (w.rank, w.world_size, w.local_rank, w.device_index) == (3, 4, 1, 0)
    assert os.environ["LOCAL_RANK"] == "0"
    w.set_dispatch_info("rollout", 1, 2, True)
    assert w.get_dispatch_info("rollout") == (1, 2, True) and w.get_dispatch_info("train") is None
    with pytest.raises(ValueError, match="dp_rank"):
        w.set_dispatch_info("rollout", 2, 2, False)


def test_init_distributed_names_missing_env(monkeypatch):
    for k in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        init_distributed(10)


def test_non_tensor_arrays_survive_split():
    d = rows(3)
    parts, layout = split_dataproto(d, 2, "m")
    assert all(isinstance(p.non_tensor_batch["tag"], np.ndarray) for p in parts)
    assert layout.real == (2, 1)
