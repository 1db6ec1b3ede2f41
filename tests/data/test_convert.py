"""`hybridrl data convert`: JSONL, CSV, a parquet folder of splits and a `datasets` directory into the trainer's
schema, read back by the trainer's own reader; each bad input named."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridrl.data.convert import ConvertError, convert
from hybridrl.data.rl_dataset import read_rows

ROWS = [{"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2", "level": 1},
        {"question": "What is 2 + 5?", "answer": "#### 7", "level": 2}]


def _check(out, prompt_text="What is 1 + 1?"):
    rows = read_rows([str(out)])  # the trainer's schema check passes
    assert rows[0]["prompt"][-1] == {"role": "user", "content": prompt_text}
    assert rows[0]["reward_model"]["ground_truth"] == "2" and rows[0]["data_source"] == "my_task"
    return rows


def test_jsonl_with_template_system_and_extra_keys(tmp_path):
    src = tmp_path / "q.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    out = convert(src, tmp_path / "o.parquet", "question", "answer", "my_task", answer_after="####",
                  prompt_template="Q: {question} (level {level})", system="Be brief.", extra_keys=["level"])
    rows = _check(out, "Q: What is 1 + 1? (level 1)")
    assert rows[0]["prompt"][0] == {"role": "system", "content": "Be brief."}
    assert rows[1]["extra_info"] == {"split": "train", "index": 1, "level": 2}
    assert pq.read_table(out).column("answer").to_pylist()[0] == "1 + 1 = 2\n#### 2"  # the SFT target


def test_csv_and_a_parquet_folder_of_splits(tmp_path):
    src = tmp_path / "q.csv"
    src.write_text("question,answer\nWhat is 1 + 1?,2\n")
    _check(convert(src, tmp_path / "csv.parquet", "question", "answer", "my_task"))
    folder = tmp_path / "hub" / "data"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(ROWS), folder / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS[1:]), folder / "test-00000-of-00001.parquet")
    with pytest.raises(ConvertError, match=r"several splits \['test', 'train'\]: choose one with --split"):
        convert(tmp_path / "hub", tmp_path / "x.parquet", "question", "answer", "my_task")
    out = convert(tmp_path / "hub", tmp_path / "train.parquet", "question", "answer", "my_task", split="train",
                  answer_after="####")
    assert len(_check(out)) == 2


def test_a_datasets_directory(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the datasets package is not installed (optional)")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "ds"))
    out = convert(tmp_path / "ds", tmp_path / "o.parquet", "question", "answer", "my_task", split="train",
                  answer_after="####")
    assert len(_check(out)) == 2


def test_messages_already_in_chat_form_are_kept(tmp_path):
    src = tmp_path / "chat.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "user", "content": "What is 1 + 1?"}], "gt": 2}) + "\n")
    _check(convert(src, tmp_path / "o.parquet", "messages", "gt", "my_task"))


@pytest.mark.parametrize("kwargs,message", [
    (dict(prompt_key="prompt"), r"--prompt-key 'prompt': .* has no column 'prompt' \(its columns: \['answer', "),
    (dict(answer_after="@@"), r"--answer-after '@@': row 0's answer has no '@@'"),
    (dict(prompt_template="{topic}: {question}"), r"--prompt-template names the column 'topic'"),
    (dict(data_source=""), r"--data-source must be a non-empty name"),
])
def test_bad_options_are_named_and_nothing_is_written(tmp_path, kwargs, message):
    src = tmp_path / "q.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    args = dict(prompt_key="question", answer_key="answer", data_source="my_task") | kwargs
    with pytest.raises(ConvertError, match=message):
        convert(src, tmp_path / "o.parquet", **args)
    assert not (tmp_path / "o.parquet").exists()


def test_bad_sources_are_named(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"question": "x", "answer": "1"}\nnot json\n')
    with pytest.raises(ConvertError, match=r"bad.jsonl: line 2 is not JSON"):
        convert(tmp_path / "bad.jsonl", tmp_path / "o.parquet", "question", "answer", "t")
    (tmp_path / "q.txt").write_text("x")
    with pytest.raises(ConvertError, match=r"unknown format '.txt'"):
        convert(tmp_path / "q.txt", tmp_path / "o.parquet", "question", "answer", "t")
    with pytest.raises(ConvertError, match=r"does not exist"):
        convert(tmp_path / "nope.jsonl", tmp_path / "o.parquet", "question", "answer", "t")
