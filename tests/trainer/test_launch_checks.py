"""Inputs that launch.py refuses before Ray or any worker starts: an empty (or config-less) model directory and a
data file without rows, each named in the error."""

import pyarrow.parquet as pq
import pytest

from hybridrl.config.loader import load_config
from hybridrl.trainer.launch import run_ppo


@pytest.fixture(scope="module")
def arith_files(tmp_path_factory):
    from hybridrl.data.tasks import make_dataset

    out = tmp_path_factory.mktemp("arith")
    make_dataset("arith", out, n_train=8, n_test=4, seed=0, digits=1, operands=2, ops="+")
    empty = out / "empty.parquet"
    pq.write_table(pq.read_table(out / "test.parquet").slice(0, 0), empty)  # the schema, no rows
    return out


@pytest.fixture
def no_ray(monkeypatch):
    """Fails the test if the run gets as far as starting (or joining) Ray."""
    def refuse(*args, **kwargs):
        raise AssertionError("Ray was started before the bad input was refused")

    monkeypatch.setattr("hybridrl.controller.init_ray", refuse)


def config(tmp_path, model_dir, arith_files, *extra):
    return load_config(overrides=[
        f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={arith_files / 'train.parquet'}",
        f"data.val_files={arith_files / 'test.parquet'}", "data.train_batch_size=4", "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.device=cpu", f"trainer.default_local_dir={tmp_path / 'run'}", *extra])


@pytest.mark.parametrize("contents", [[], ["model.safetensors", "tokenizer.json"]], ids=["empty", "no_config_json"])
def test_model_directory_without_config_json_is_named(tmp_path, arith_files, no_ray, contents):
    model = tmp_path / "model"
    model.mkdir()
    for name in contents:
        (model / name).write_text("")
    with pytest.raises(FileNotFoundError) as e:
        run_ppo(config(tmp_path, model, arith_files))
    msg = str(e.value)
    assert f"actor_rollout_ref.model.path='{model}'" in msg and "no config.json" in msg, msg
    assert all(name in msg for name in contents), msg


def test_critic_model_directory_is_checked_too(tmp_path, tiny_model_dir, arith_files, no_ray):
    (tmp_path / "critic").mkdir()
    with pytest.raises(FileNotFoundError, match=r"critic.model.path=.*no config.json"):
        run_ppo(config(tmp_path, tiny_model_dir, arith_files, "algorithm.adv_estimator=gae",
                       f"critic.model.path={tmp_path / 'critic'}"))


@pytest.mark.parametrize("key", ["data.val_files", "data.train_files"])
def test_data_file_without_rows_is_named(tmp_path, tiny_model_dir, arith_files, no_ray, key):
    empty = arith_files / "empty.parquet"
    with pytest.raises(ValueError) as e:
        run_ppo(config(tmp_path, tiny_model_dir, arith_files, f"{key}={empty}"))
    msg = str(e.value)
    assert msg.startswith(f"{key}:") and str(empty) in msg and "no rows" in msg, msg


def test_every_missing_path_is_reported_at_once(tmp_path, no_ray):
    """A model, a train file and a validation file that are all absent: one error names all three, each with the
    command that makes it, before Ray starts."""
    from hybridrl.config.paths import MissingPathsError

    cfg = load_config(overrides=[
        f"actor_rollout_ref.model.path={tmp_path / 'no_model'}", f"data.train_files={tmp_path / 'no_train.parquet'}",
        f"data.val_files=[{tmp_path / 'no_val.parquet'}]", f"custom_reward_function.path={tmp_path / 'no_reward.py'}",
        "trainer.device=cpu", f"trainer.default_local_dir={tmp_path / 'run'}"])
    with pytest.raises(MissingPathsError) as e:
        run_ppo(cfg)
    assert isinstance(e.value, FileNotFoundError)
    problems = e.value.errors
    assert len(problems) == 4, problems
    assert problems[0].startswith(f"actor_rollout_ref.model.path='{tmp_path / 'no_model'}' does not exist")
    assert "hybridrl assets tiny-model DIR" in problems[0]
    assert problems[1].startswith("data.train_files:") and "no_train.parquet" in problems[1]
    assert "hybridrl data make TASK --out DIR" in problems[1] and "hybridrl data convert" in problems[1]
    assert "no_val.parquet" in problems[2] and "data.val_files=null turns validation off" in problems[2]
    assert problems[3].startswith(f"custom_reward_function.path='{tmp_path / 'no_reward.py'}' does not exist")


def test_the_packaged_defaults_name_the_demo_as_what_makes_their_paths(tmp_path, monkeypatch):
    from hybridrl.config.paths import path_problems

    monkeypatch.setenv("HYBRIDRL_HOME", str(tmp_path))
    cfg = load_config()
    demo = tmp_path / "demo"
    assert cfg.actor_rollout_ref.model.path == f"{demo}/runs/sft/huggingface"  # the demo's SFT output
    assert cfg.data.train_files == f"{demo}/data/train.parquet" and cfg.data.val_files == f"{demo}/data/test.parquet"
    problems = path_problems(cfg)
    assert len(problems) == 3 and all("the demo's; `hybridrl train` with no arguments builds it" in p
                                      for p in problems), problems


def test_data_files_columns_are_checked_with_the_paths(tmp_path, tiny_model_dir, arith_files):
    """What `config check` reports before GPU time: a file without data.prompt_key's column, and a
    data.reward_fn_key that names no column, each with the file named."""
    import pyarrow as pa

    from hybridrl.config.paths import path_problems

    table = pq.read_table(arith_files / "train.parquet")
    pq.write_table(table.rename_columns(["question" if n == "prompt" else n for n in table.column_names]),
                   tmp_path / "renamed.parquet")
    problems = path_problems(config(tmp_path, tiny_model_dir, arith_files, f"data.train_files={tmp_path / 'renamed.parquet'}"))
    assert len(problems) == 1 and "data.train_files" in problems[0] and "'prompt' is missing" in problems[0]
    assert "renamed.parquet" in problems[0]
    problems = path_problems(config(tmp_path, tiny_model_dir, arith_files, "data.reward_fn_key=task"))
    assert len(problems) == 2 and all("data.reward_fn_key='task' names no column" in p for p in problems)
    pq.write_table(table.append_column("task", pa.array(["a"] * len(table))), tmp_path / "tasks.parquet")
    assert path_problems(config(tmp_path, tiny_model_dir, arith_files, "data.reward_fn_key=task",
                                f"data.train_files={tmp_path / 'tasks.parquet'}", "data.val_files=null")) == []
    assert path_problems(config(tmp_path, tiny_model_dir, arith_files)) == []


def test_training_rows_must_fill_a_generation_batch(tmp_path, tiny_model_dir, arith_files):
    """`config check` counts the training files' rows (parquet footers, JSON Lines lines, summed over a list) against
    the generation batch, data.train_max_samples applied; files it cannot count are left to the dataset."""
    import json

    from hybridrl.config.paths import path_problems

    train = arith_files / "train.parquet"  # 8 rows
    assert path_problems(config(tmp_path, tiny_model_dir, arith_files, "data.train_batch_size=8",
                                "actor_rollout_ref.actor.ppo_mini_batch_size=8")) == []
    problems = path_problems(config(tmp_path, tiny_model_dir, arith_files, "data.train_batch_size=12",
                                    "actor_rollout_ref.actor.ppo_mini_batch_size=12"))
    assert problems == ["data.train_batch_size=12 is larger than the training files' 8 rows: no full batch can be "
                        "formed (lower data.train_batch_size, or add rows to data.train_files)"]
    both = f"data.train_files=[{train},{train}]"
    assert path_problems(config(tmp_path, tiny_model_dir, arith_files, both, "data.train_batch_size=12",
                                "actor_rollout_ref.actor.ppo_mini_batch_size=12")) == []
    capped = path_problems(config(tmp_path, tiny_model_dir, arith_files, both, "data.train_batch_size=12",
                                  "actor_rollout_ref.actor.ppo_mini_batch_size=12", "data.train_max_samples=10"))
    assert len(capped) == 1 and "16 rows, of which data.train_max_samples=10 are used" in capped[0]
    gen = path_problems(config(tmp_path, tiny_model_dir, arith_files, "data.gen_batch_size=12",
                               "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"))
    assert len(gen) == 1 and gen[0].startswith("data.gen_batch_size=12 is larger than the training files' 8 rows")
    rows = pq.read_table(train).to_pylist()
    lines = tmp_path / "train.jsonl"
    lines.write_text("\n".join(json.dumps(r) for r in rows[:3]) + "\n\n")
    jsonl = path_problems(config(tmp_path, tiny_model_dir, arith_files, f"data.train_files={lines}"))
    assert len(jsonl) == 1 and "training files' 3 rows" in jsonl[0]
    array = tmp_path / "train.json"
    array.write_text(json.dumps(rows[:3]))
    assert path_problems(config(tmp_path, tiny_model_dir, arith_files, f"data.train_files={array}")) == []
