import argparse

import pyarrow.parquet as pq
import pytest

from hybridrl.data.cli import register
from hybridrl.data.tasks import TASKS, make_task
from hybridrl.rewards import default_compute_score


@pytest.mark.parametrize("name", sorted(TASKS))
def test_same_seed_gives_byte_identical_files(tmp_path, name):
    a = make_task(name, tmp_path / "a", 40, 10, seed=7)
    b = make_task(name, tmp_path / "b", 40, 10, seed=7)
    c = make_task(name, tmp_path / "c", 40, 10, seed=8)
    for split in ("train", "test"):
        assert a[split].read_bytes() == b[split].read_bytes()
        assert a[split].read_bytes() != c[split].read_bytes()


@pytest.mark.parametrize("name", sorted(TASKS))
def test_rows_follow_verl_schema_and_answers_score_one(tmp_path, name):
    paths = make_task(name, tmp_path, 30, 10, seed=1)
    train, test = (pq.read_table(paths[s]).to_pylist() for s in ("train", "test"))
    assert len(train) == 30 and len(test) == 10
    questions = {r["prompt"][-1]["content"] for r in train + test}
    assert len(questions) == 40  # unique across splits: no train/test leakage
    for split, rows in (("train", train), ("test", test)):
        for i, r in enumerate(rows):
            assert r["prompt"][-1]["role"] == "user" and r["reward_model"]["style"] == "rule"
            assert r["extra_info"]["split"] == split and r["extra_info"]["index"] == i
            assert r["data_source"] == TASKS[name].data_source
            assert default_compute_score(r["data_source"], r["answer"], r["reward_model"]["ground_truth"]) == 1.0
            assert default_compute_score(r["data_source"], "I don't know", r["reward_model"]["ground_truth"]) == 0.0


def test_knobs_change_output_and_are_validated(tmp_path):
    rows = TASKS["arith"].generate(20, 0, seed=0, knobs={"digits": 3, "operands": 3, "ops": "*/"})["train"]
    for r in rows:
        assert r["extra_info"]["expression"].count(" ") == 4
        assert set(r["extra_info"]["expression"].split()[1::2]) <= {"*", "/"}
    with pytest.raises(ValueError, match="'ops'"):
        TASKS["arith"].generate(1, 0, 0, {"ops": "+^"})
    with pytest.raises(ValueError, match="unknown knob"):
        TASKS["countdown"].generate(1, 0, 0, {"digits": 2})
    with pytest.raises(ValueError, match="unique questions"):  # 9 single-digit * 9 = 81 questions at most
        TASKS["arith"].generate(100, 0, 0, {"digits": 1, "operands": 2, "ops": "+"})


def test_countdown_is_solvable_within_bounds():
    for r in TASKS["countdown"].generate(50, 0, seed=3, knobs={"num_numbers": 3, "max_target": 50})["train"]:
        assert len(r["extra_info"]["numbers"]) == 3 and 1 <= r["extra_info"]["target"] <= 50


def test_cli_make(tmp_path):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["data", "make", "countdown", "--out", str(tmp_path), "--train", "5", "--test", "2",
                              "--seed", "1", "--num-numbers", "3"])
    args.func(args)
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert len(rows) == 5 and all(len(r["extra_info"]["numbers"]) == 3 for r in rows)
    assert pq.read_table(tmp_path / "test.parquet").num_rows == 2


def test_arith_unmarked_solutions_lack_only_the_answer_line():
    # the demo's SFT data: a fraction of solutions stop after the working, which the strict scorer gives 0
    rows = TASKS["arith"].generate(200, 0, seed=0, knobs={"digits": 1, "operands": 3, "ops": "+",
                                                           "unmarked": 0.6})["train"]
    unmarked = [r for r in rows if "####" not in r["answer"]]
    assert 0.5 < len(unmarked) / len(rows) < 0.7
    for r in unmarked:
        truth = r["reward_model"]["ground_truth"]
        assert default_compute_score("arith", r["answer"], truth) == 0.0
        assert r["answer"].endswith(f"= {truth}")  # the same working, right answer, no `#### N` line
    plain = TASKS["arith"].generate(20, 5, seed=0, knobs={"digits": 1, "operands": 3, "ops": "+"})
    zero = TASKS["arith"].generate(20, 5, seed=0, knobs={"digits": 1, "operands": 3, "ops": "+", "unmarked": 0})
    assert plain == zero  # 0 draws nothing extra: earlier seeds give the same files
    with pytest.raises(ValueError, match="'unmarked'"):
        TASKS["arith"].generate(1, 0, 0, {"unmarked": 1.5})


def test_bignum_needs_the_calculator_and_pays_only_the_exact_integer(tiny_model_dir):
    from transformers import AutoTokenizer

    from hybridrl.tools.builtin import TOOL_SPECS, calculator

    rows = TASKS["bignum"].generate(50, 0, seed=0)["train"]
    for r in rows:
        a, b = map(int, r["extra_info"]["expression"].split(" * "))
        assert 8 <= len(str(a)) <= 12 and 8 <= len(str(b)) <= 12
        truth = r["reward_model"]["ground_truth"]
        assert calculator(r["extra_info"]["expression"]) == truth == str(a * b)
        assert [m["role"] for m in r["prompt"]] == ["system", "user"] and "calculator" in r["prompt"][0]["content"]
        assert default_compute_score("bignum", f"so\n#### {int(truth):,}", truth) == 1.0  # digit grouping is fine
        for wrong in (f"#### {int(truth) + 1}", f"#### {truth}.0", f"#### {float(truth):e}", truth):
            assert default_compute_score("bignum", wrong, truth) == 0.0, wrong
    assert len({len(r["reward_model"]["ground_truth"]) for r in rows}) > 3  # 16..24-digit products
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)  # the system message and the tool list, as the dataset renders
    text = tok.apply_chat_template(rows[0]["prompt"], tools=TOOL_SPECS[:1], add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\n" + rows[0]["prompt"][0]["content"] + "\n\n# Tools")
    assert '"name": "calculator"' in text
    with pytest.raises(ValueError, match="min_digits=9 must be <= max_digits=8"):
        TASKS["bignum"].generate(1, 0, 0, {"min_digits": 9, "max_digits": 8})
