"""DataProto: split/merge round trips, union rules, repeat, select/pop errors, disk round trip, metrics merging."""

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto, collate_rows, pad_dataproto_to_divisor, unpad_dataproto


def make(n: int = 7, width: int = 3) -> DataProto:
    ids = torch.arange(n * width).reshape(n, width)
    return DataProto.from_dict(
        {"input_ids": ids, "mask": (ids % 2).bool()},
        {"uid": [f"u{i}" for i in range(n)], "raw_prompt_ids": [list(range(i + 1)) for i in range(n)],
         "reward_model": [{"ground_truth": str(i)} for i in range(n)]},
        {"temperature": 1.0})


def assert_same(a: DataProto, b: DataProto):
    assert set(a.batch) == set(b.batch) and set(a.non_tensor_batch) == set(b.non_tensor_batch)
    for k in a.batch:
        assert torch.equal(a.batch[k], b.batch[k]), k
    for k in a.non_tensor_batch:
        assert list(a.non_tensor_batch[k]) == list(b.non_tensor_batch[k]), k


@pytest.mark.parametrize("n,parts", [(7, 3), (5, 2), (1, 4), (6, 3)])
def test_pad_chunk_concat_unpad_round_trip(n, parts):
    data = make(n)
    padded, pad = pad_dataproto_to_divisor(data, parts)
    assert pad == (-n) % parts and len(padded) == n + pad
    chunks = padded.chunk(parts)
    assert [len(c) for c in chunks] == [(n + pad) // parts] * parts
    assert torch.equal(padded.batch["input_ids"][n:], data.batch["input_ids"][torch.arange(pad) % n])  # pad rows
    back = unpad_dataproto(DataProto.concat(chunks), pad)
    assert_same(back, data)
    assert back.meta_info["temperature"] == 1.0


def test_chunk_requires_divisible_and_split_keeps_remainder():
    with pytest.raises(ValueError, match="not divisible by chunks=3"):
        make(7).chunk(3)
    pieces = make(7).split(3)
    assert [len(p) for p in pieces] == [3, 3, 1]
    assert_same(DataProto.concat(pieces), make(7))
    empty, pad = pad_dataproto_to_divisor(DataProto(), 2)  # 0 rows are divisible by anything
    assert (len(empty), pad) == (0, 0)


def test_inconsistent_lengths_are_rejected_with_sizes():
    with pytest.raises(ValueError, match="batch dimension"):
        DataProto.from_dict({"a": torch.zeros(3, 2)}, {"uid": ["x", "y"]})


def test_union_merges_and_rejects_conflicts():
    data = make(4)
    extra = DataProto.from_dict({"values": torch.ones(4, 3), "input_ids": data.batch["input_ids"].clone()},
                                {"uid": data.non_tensor_batch["uid"].copy()}, {"temperature": 1.0, "eos": 2})
    out = data.union(extra)
    assert out is data and "values" in data and data.meta_info["eos"] == 2
    for key, other in [
        ("input_ids", DataProto.from_dict({"input_ids": torch.zeros(4, 3, dtype=torch.long)})),
        ("uid", DataProto.from_dict(non_tensors={"uid": ["a", "b", "c", "d"]})),
        ("temperature", DataProto(meta_info={"temperature": 0.5})),
    ]:
        with pytest.raises(ValueError, match=repr(key)):
            make(4).union(other)
    with pytest.raises(ValueError, match="batch sizes differ"):
        make(4).union(make(3))


def test_union_with_empty_keyed_batch_cannot_leave_inconsistent_data():
    empty_rows = DataProto.from_dict({"values": torch.zeros(0, 3)})
    with pytest.raises(ValueError, match="batch dimension"):
        make(4).union(empty_rows)


def test_union_accepts_equal_numpy_meta():
    a = DataProto(meta_info={"idx": np.arange(3)})
    a.union(DataProto(meta_info={"idx": np.arange(3)}))
    with pytest.raises(ValueError, match="'idx'"):
        a.union(DataProto(meta_info={"idx": np.arange(4)}))


def test_repeat_interleave_and_tile():
    data = make(2)
    inter = data.repeat(3, interleave=True)
    assert inter.batch["input_ids"][:, 0].tolist() == [0, 0, 0, 3, 3, 3]
    assert list(inter.non_tensor_batch["uid"]) == ["u0", "u0", "u0", "u1", "u1", "u1"]
    tiled = data.repeat(2, interleave=False)
    assert tiled.batch["input_ids"][:, 0].tolist() == [0, 3, 0, 3]
    assert list(tiled.non_tensor_batch["uid"]) == ["u0", "u1", "u0", "u1"]


def test_select_and_pop():
    data = make(3)
    sel = data.select(["input_ids"], ["uid"])
    assert sel.keys() == ["input_ids", "uid"] and "mask" in data
    deep = data.select(["input_ids"], deepcopy=True)
    deep.batch["input_ids"][0, 0] = -1
    assert data.batch["input_ids"][0, 0] == 0
    with pytest.raises(KeyError, match="nope"):
        data.select(["nope"])
    with pytest.raises(KeyError, match="missing_nt"):
        data.select(non_tensor_batch_keys=["missing_nt"])
    popped = data.pop(["mask"], ["reward_model"], ["temperature"])
    assert popped.keys() == ["mask", "reward_model"] and popped.meta_info == {"temperature": 1.0}
    assert "mask" not in data and "temperature" not in data.meta_info
    with pytest.raises(KeyError, match="mask"):
        data.pop(["mask"])
    assert "input_ids" in data  # a failed pop removes nothing
    with pytest.raises(KeyError, match="no key 'zzz'"):
        data["zzz"]


def test_indexing_forms():
    data = make(5)
    assert data[1].batch["input_ids"].tolist() == [[3, 4, 5]]
    assert data[-1].non_tensor_batch["uid"].tolist() == ["u4"]
    mask = torch.tensor([True, False, True, False, False])
    assert data.select_idxs(mask).non_tensor_batch["uid"].tolist() == ["u0", "u2"]
    assert data[[4, 0]].batch["input_ids"][:, 0].tolist() == [12, 0]
    data.reorder(torch.tensor([4, 3, 2, 1, 0]))
    assert data.non_tensor_batch["uid"].tolist() == ["u4", "u3", "u2", "u1", "u0"]


def test_save_load_round_trip(tmp_path):
    data = make(4)
    data.meta_info["metrics"] = {"a": 1.0}
    data.save_to_disk(tmp_path / "d.pkl")
    back = DataProto.load_from_disk(tmp_path / "d.pkl")
    assert_same(back, data)
    assert back.meta_info == data.meta_info
    assert back.non_tensor_batch["raw_prompt_ids"].dtype == object


def test_concat_merges_metrics_and_checks_keys():
    a, b = make(2), make(3)
    a.meta_info["metrics"] = {"loss": 1.0, "lr": [0.1]}
    b.meta_info["metrics"] = {"loss": [2.0, 3.0]}
    out = DataProto.concat([a, b])
    assert len(out) == 5
    assert out.meta_info["metrics"] == {"loss": [1.0, 2.0, 3.0], "lr": [0.1]}
    assert a.meta_info["metrics"] == {"loss": 1.0, "lr": [0.1]}  # inputs untouched
    with pytest.raises(ValueError, match="item 1 has keys"):
        DataProto.concat([a, a.select(["input_ids"])])
    with pytest.raises(ValueError, match="nothing to concatenate"):
        DataProto.concat([])
    with pytest.raises(ValueError, match="'input_ids' has different trailing shapes"):
        DataProto.concat([make(2, width=3), make(2, width=4)])


def test_collate_rows():
    rows = [{"x": torch.tensor([i, i]), "uid": f"u{i}", "extra": {"k": i}} for i in range(3)]
    d = collate_rows(rows)
    assert d.batch["x"].shape == (3, 2) and d.non_tensor_batch["extra"][2] == {"k": 2}
    with pytest.raises(ValueError, match="empty"):
        collate_rows([])
