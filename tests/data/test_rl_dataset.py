import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from hybridrl.data import RLHFDataset, StatefulDataLoader, make_task
from hybridrl.data.rl_dataset import dataset_metrics
from hybridrl.protocol import DataProto

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def write_verl_gsm8k(path, n=6):
    """The exact layout verl's examples/data_preprocess/gsm8k.py writes (via HF datasets)."""
    rows = [{"data_source": "openai/gsm8k",
             "prompt": [{"role": "user", "content": f"Tom has {i} apples and buys {i + 2} more. How many? {INSTRUCTION}"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * i + 2)},
             "extra_info": {"split": "train", "index": i, "answer": f"{i}+{i + 2}=<<{i}+{i + 2}={2 * i + 2}>>\n#### {2 * i + 2}",
                            "question": f"Tom has {i} apples and buys {i + 2} more. How many?"}}
            for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return rows


def test_verl_gsm8k_parquet_loads_unchanged(tmp_path, tok):
    rows = write_verl_gsm8k(tmp_path / "gsm8k.parquet")
    ds = RLHFDataset(str(tmp_path / "gsm8k.parquet"), tok, {"max_prompt_length": 96})
    assert len(ds) == len(rows) and ds.num_filtered == 0
    item = ds[2]
    ids = item["raw_prompt_ids"]
    rendered = tok.apply_chat_template(rows[2]["prompt"], add_generation_prompt=True, tokenize=False)
    assert tok.decode(ids) == rendered
    assert item["input_ids"].shape == (96,) and item["input_ids"][-len(ids):].tolist() == ids
    assert item["input_ids"][: 96 - len(ids)].eq(tok.pad_token_id).all()
    assert item["attention_mask"].sum() == len(ids)
    assert item["position_ids"][-1] == len(ids) - 1 and item["position_ids"][0] == 0
    assert item["reward_model"]["ground_truth"] == "6" and item["data_source"] == "openai/gsm8k"
    assert item["index"] == 2 and item["ability"] == "math"


def test_the_files_other_columns_reach_the_batch(tmp_path, tok):
    """verl's dataset passes every column on (data.reward_fn_key may name one of them); files with different
    columns batch together, None where a row's file lacks one."""
    rows = write_verl_gsm8k(tmp_path / "a.parquet", n=2)
    pq.write_table(pa.Table.from_pylist([{**r, "task": f"t{i}", "difficulty": i} for i, r in enumerate(rows)]),
                   tmp_path / "b.parquet")
    ds = RLHFDataset([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")], tok, {"max_prompt_length": 96})
    assert ds[2]["task"] == "t0" and ds[3]["difficulty"] == 1 and "task" not in ds[0]
    batch = StatefulDataLoader(ds, batch_size=4, shuffle=False).__iter__().__next__()
    assert list(batch.non_tensor_batch["task"]) == [None, None, "t0", "t1"]
    assert batch.non_tensor_batch["data_source"][3] == "openai/gsm8k"


def test_multiple_files_and_overlong_filter_counted(tmp_path, tok):
    write_verl_gsm8k(tmp_path / "a.parquet", n=4)
    long_row = {"data_source": "arith", "prompt": [{"role": "user", "content": "word " * 200}], "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": "1"}}
    pq.write_table(pa.Table.from_pylist([long_row, {**long_row, "prompt": [{"role": "user", "content": "hi"}]}]),
                   tmp_path / "b.parquet")
    ds = RLHFDataset([tmp_path / "a.parquet", tmp_path / "b.parquet"], tok, {"max_prompt_length": 64})
    assert len(ds) == 5 and ds.num_filtered == 1
    assert ds[4]["extra_info"] == {} and ds[4]["index"] == 4  # no extra_info column: defaults


def test_max_samples_keeps_the_first_rows_or_a_seeded_random_subset(tmp_path, tok):
    write_verl_gsm8k(tmp_path / "g.parquet", n=10)
    path = str(tmp_path / "g.parquet")

    def truths(n=-1, **cfg):
        ds = RLHFDataset(path, tok, {"max_prompt_length": 96, **cfg}, max_samples=n)
        return [ds[i]["reward_model"]["ground_truth"] for i in range(len(ds))], ds.num_rows_read

    assert truths(shuffle=False, n=3) == (["2", "4", "6"], 10)
    first, _ = truths(shuffle=True, seed=7, n=4)
    assert len(set(first)) == 4 and first == truths(shuffle=True, seed=7, n=4)[0] != truths(shuffle=True, seed=8, n=4)[0]
    assert len(truths(n=-1)[0]) == len(truths(n=10)[0]) == len(truths(n=50)[0]) == 10


@pytest.mark.parametrize("mode", ["left", "right", "middle", "error"])
def test_truncation_modes(tmp_path, tok, mode):
    row = {"data_source": "arith", "prompt": [{"role": "user", "content": "word " * 100}],
           "reward_model": {"style": "rule", "ground_truth": "1"}}
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "long.parquet")
    cfg = {"max_prompt_length": 16, "filter_overlong_prompts": False, "truncation": mode}
    if mode == "error":
        with pytest.raises(ValueError, match="max_prompt_length=16"):
            RLHFDataset(tmp_path / "long.parquet", tok, cfg)
        return
    ds = RLHFDataset(tmp_path / "long.parquet", tok, cfg)
    ids = ds[0]["raw_prompt_ids"]
    assert len(ids) == 16 and ds.num_truncated == 1 and ds[0]["attention_mask"].all()
    full = tok.encode(tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False),
                      add_special_tokens=False)
    want = {"left": full[-16:], "right": full[:16], "middle": full[:8] + full[-8:]}[mode]   # verl's middle: both ends
    assert ids == want


def test_truncated_and_filtered_prompts_are_reported(tmp_path, tok, caplog):
    long_row = {"data_source": "arith", "prompt": [{"role": "user", "content": "word " * 100}],
                "reward_model": {"style": "rule", "ground_truth": "1"}}
    short_row = {**long_row, "prompt": [{"role": "user", "content": "hi"}]}
    pq.write_table(pa.Table.from_pylist([long_row, short_row, long_row]), tmp_path / "mixed.parquet")
    cfg = {"max_prompt_length": 16, "filter_overlong_prompts": False, "truncation": "left"}
    with caplog.at_level("WARNING"):
        truncated = RLHFDataset(tmp_path / "mixed.parquet", tok, cfg)
    assert dataset_metrics(truncated) == {"data/filtered_prompts": 0.0, "data/truncated_prompts": 2.0,
                                          "data/prompts": 3.0}
    assert "truncated 2 prompts" in caplog.text
    filtered = RLHFDataset(tmp_path / "mixed.parquet", tok, {**cfg, "filter_overlong_prompts": True})
    assert dataset_metrics(filtered)["data/filtered_prompts"] == 2.0


def test_schema_errors_name_file_and_column(tmp_path, tok):
    good = {"data_source": "arith", "prompt": [{"role": "user", "content": "x"}],
            "reward_model": {"style": "rule", "ground_truth": "1"}}
    cases = {"missing.parquet": ({k: v for k, v in good.items() if k != "reward_model"}, "'reward_model' is missing"),
             "prompt_str.parquet": ({**good, "prompt": "just a string"}, "'prompt' must be a list"),
             "source_int.parquet": ({**good, "data_source": 3}, "'data_source' must be a string"),
             "rm_no_gt.parquet": ({**good, "reward_model": {"style": "rule"}}, "'reward_model' must be a struct")}
    for name, (row, message) in cases.items():
        pq.write_table(pa.Table.from_pylist([row]), tmp_path / name)
        with pytest.raises(ValueError, match=message) as err:
            RLHFDataset(tmp_path / name, tok, {})
        assert name in str(err.value)
    with pytest.raises(FileNotFoundError, match="nothere.parquet"):
        RLHFDataset(tmp_path / "nothere.parquet", tok, {})
    with pytest.raises(ValueError, match="data.truncation='both'"):
        RLHFDataset(tmp_path / "missing.parquet", tok, {"truncation": "both"})
    (tmp_path / "not_parquet.parquet").write_text("{}")
    with pytest.raises(ValueError, match="not_parquet.parquet' is not a parquet file.*JSON named"):
        RLHFDataset(tmp_path / "not_parquet.parquet", tok, {})


def test_bad_prompts_name_file_row_and_column(tmp_path, tok):
    good = {"data_source": "arith", "prompt": [{"role": "user", "content": "x"}],
            "reward_model": {"style": "rule", "ground_truth": "1"}}
    pq.write_table(pa.Table.from_pylist([good]), tmp_path / "first.parquet")
    for prompt, message in (([], "the prompt holds no messages"),
                            ([{"role": "user", "content": None}], "message 0 is .*string 'content' \\(null only")):
        pq.write_table(pa.Table.from_pylist([good, good, {**good, "prompt": prompt}]), tmp_path / "bad.parquet")
        with pytest.raises(ValueError, match=rf"bad.parquet: row 2, column 'prompt': {message}"):
            RLHFDataset([tmp_path / "first.parquet", tmp_path / "bad.parquet"], tok, {})  # the row counts per file


def test_loader_batches_and_resumes_exactly(tmp_path, tok):
    paths = make_task("arith", tmp_path, 22, 0, seed=0)
    ds = RLHFDataset(paths["train"], tok, {"max_prompt_length": 64})
    loader = StatefulDataLoader(ds, batch_size=4, shuffle=True, seed=5)
    assert len(loader) == 5 and loader.num_dropped_per_epoch == 2
    it = iter(loader)
    first = [next(it) for _ in range(2)]
    assert isinstance(first[0], DataProto) and first[0].batch["input_ids"].shape == (4, 64)
    assert set(first[0].non_tensor_batch) >= {"raw_prompt_ids", "data_source", "reward_model", "extra_info", "index"}
    state = loader.state_dict()
    rest = list(it) + list(loader)  # rest of epoch 0, then all of epoch 1
    resumed = StatefulDataLoader(ds, batch_size=4, shuffle=True, seed=5)
    resumed.load_state_dict(state)
    again = list(resumed) + list(resumed)
    assert len(again) == len(rest) == 3 + 5
    for a, b in zip(again, rest):
        assert torch.equal(a.batch["input_ids"], b.batch["input_ids"])
        assert list(a.non_tensor_batch["index"]) == list(b.non_tensor_batch["index"])
    epoch0 = [i for b in first + rest[:3] for i in b.non_tensor_batch["index"]]
    assert len(set(epoch0)) == 20  # no row twice within an epoch
    with pytest.raises(ValueError, match="seed"):
        StatefulDataLoader(ds, batch_size=4, seed=6).load_state_dict(state)
    with pytest.raises(ValueError, match="train_batch_size=64"):
        StatefulDataLoader(ds, batch_size=64)
    # resumed with another batch size (as verl allows): the same order from the same sample, in the new size
    wider = StatefulDataLoader(ds, batch_size=6, shuffle=True, seed=5)
    wider.load_state_dict(state)
    rows = [list(b.non_tensor_batch["index"]) for b in wider]
    assert rows == [epoch0[8:14], epoch0[14:20]] and wider.batch_index == 4
    older = {k: v for k, v in state.items() if k != "sample_index"}   # a checkpoint that counted batches only
    narrow = StatefulDataLoader(ds, batch_size=2, shuffle=True, seed=5)
    narrow.load_state_dict(older)
    tail = [i for b in narrow for i in b.non_tensor_batch["index"]]
    assert tail[:12] == epoch0[8:20] and len(tail) == 14   # size 2 reaches the 2 rows size 4 drops


def _row(**changes):
    return {"data_source": "arith", "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
            "reward_model": {"style": "rule", "ground_truth": "4"}, **changes}


def test_messages_keep_their_tool_calls_as_verl_renders_them(tmp_path, tok):
    call = {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2 + 2"}'}}
    prompt = [{"role": "user", "content": "What is 2 + 2?"},
              {"role": "assistant", "content": None, "tool_calls": [call]},
              {"role": "tool", "content": "4", "name": "calculator"},
              {"role": "user", "content": "And 3 + 3?"}]
    pq.write_table(pa.Table.from_pylist([_row(prompt=prompt)]), tmp_path / "tools.parquet")
    ids = RLHFDataset(tmp_path / "tools.parquet", tok, {"max_prompt_length": 256})[0]["raw_prompt_ids"]
    text = tok.decode(ids)
    # arrow gave every message every field (None where absent); the template sees only the fields each has
    assert text == tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    assert "calculator" in text and "2 + 2" in text


def test_multimodal_rows_are_refused_naming_the_column(tmp_path, tok):
    rows = [_row(images=[]), _row(images=None), _row(images=[{"bytes": b"png"}])]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "geo3k.parquet")
    with pytest.raises(ValueError, match=r"geo3k.parquet: column 'images' holds images in 1 rows \(first: row 2\); "
                                         "multimodal prompts are not supported"):
        RLHFDataset(tmp_path / "geo3k.parquet", tok, {})
    pq.write_table(pa.Table.from_pylist(rows[:2]), tmp_path / "text_only.parquet")   # empty image lists: text rows
    assert len(RLHFDataset(tmp_path / "text_only.parquet", tok, {})) == 2
    pq.write_table(pa.Table.from_pylist([_row(frames=["f"])]), tmp_path / "frames.parquet")
    with pytest.raises(ValueError, match="column 'frames' holds frames"):
        RLHFDataset(tmp_path / "frames.parquet", tok, {"video_key": "frames"})


def test_json_files_load_as_parquet_does(tmp_path, tok):
    import json

    rows = write_verl_gsm8k(tmp_path / "gsm8k.parquet", n=3)
    (tmp_path / "lines.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "array.json").write_text(json.dumps(rows))
    want = [RLHFDataset(tmp_path / "gsm8k.parquet", tok, {"max_prompt_length": 96})[i]["raw_prompt_ids"]
            for i in range(3)]
    for name in ("lines.jsonl", "array.json"):
        ds = RLHFDataset(tmp_path / name, tok, {"max_prompt_length": 96})
        assert [ds[i]["raw_prompt_ids"] for i in range(3)] == want and ds[1]["reward_model"]["ground_truth"] == "4"
    (tmp_path / "bad.json").write_text('{"a": 1} trailing')
    with pytest.raises(ValueError, match="bad.json' is neither JSON Lines"):
        RLHFDataset(tmp_path / "bad.json", tok, {})


def test_null_columns_and_categorical_sources_load(tmp_path, tok):
    table = pa.Table.from_pylist([_row(ability=None, extra_info=None), _row(ability=None, extra_info=None)])
    assert pa.types.is_null(table.schema.field("ability").type)   # as pandas writes an all-None column
    table = table.set_column(table.schema.get_field_index("data_source"), "data_source",
                             table.column("data_source").dictionary_encode())   # a pandas categorical
    pq.write_table(table, tmp_path / "nulls.parquet")
    item = RLHFDataset(tmp_path / "nulls.parquet", tok, {})[1]
    assert item["ability"] == "" and item["extra_info"] == {} and item["data_source"] == "arith"


def test_validation_prompts_dropped_at_load_are_counted(tmp_path, tok):
    from hybridrl.trainer.launch import startup_data_metrics

    long_row = _row(prompt=[{"role": "user", "content": "word " * 100}])
    pq.write_table(pa.Table.from_pylist([_row(), long_row, long_row]), tmp_path / "val.parquet")
    pq.write_table(pa.Table.from_pylist([_row()]), tmp_path / "train.parquet")
    cfg = {"max_prompt_length": 32}
    metrics = startup_data_metrics(RLHFDataset(tmp_path / "train.parquet", tok, cfg),
                                   RLHFDataset(tmp_path / "val.parquet", tok, cfg))
    assert metrics["data/filtered_prompts"] == 0.0 and metrics["val-aux/data/filtered_prompts"] == 2.0
    assert metrics["val-aux/data/prompts"] == 1.0


def test_rows_asking_for_another_agent_loop_are_refused(tmp_path, tok):
    from hybridrl.trainer.launch import check_agent_names

    rows = [_row(agent_name="single_turn_agent"), _row(agent_name="tool_agent")]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "agents.parquet")
    ds = RLHFDataset(tmp_path / "agents.parquet", tok, {})
    with pytest.raises(ValueError, match=r"agents.parquet row 1 has agent_name='tool_agent'.*multi_turn.enable=False"):
        check_agent_names(ds, "data.train_files", multi_turn=False)
    with pytest.raises(ValueError, match=r"row 0 has agent_name='single_turn_agent'"):
        check_agent_names(ds, "data.train_files", multi_turn=True)
    pq.write_table(pa.Table.from_pylist(rows[1:] + [_row(agent_name=None)]), tmp_path / "tools.parquet")
    check_agent_names(RLHFDataset(tmp_path / "tools.parquet", tok, {}), "data.train_files", multi_turn=True)


def test_a_tokenizer_without_a_chat_template_names_the_keys_to_set(tmp_path, tok):
    import copy

    bare = copy.deepcopy(tok)
    bare.chat_template = None
    pq.write_table(pa.Table.from_pylist([_row()]), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match="no chat template: set actor_rollout_ref.model.custom_chat_template"):
        RLHFDataset(tmp_path / "p.parquet", bare, {})


def test_the_data_config_s_chat_template_kwargs_reach_every_render(tmp_path, tok):
    import copy

    bare = copy.deepcopy(tok)
    bare.chat_template = None
    pq.write_table(pa.Table.from_pylist([_row()]), tmp_path / "p.parquet")
    template = "{% for m in messages %}[{{ m.role }}|{{ m.content }}]{% endfor %}{% if flag %}FLAG{% endif %}"
    ds = RLHFDataset(tmp_path / "p.parquet", bare, {"apply_chat_template_kwargs": {"chat_template": template,
                                                                                    "flag": True}})
    assert bare.decode(ds[0]["raw_prompt_ids"]) == "[user|What is 2 + 2?]FLAG"
