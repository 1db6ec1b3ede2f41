"""SFT with verl's SFT trainer keys: its config file loads, checkpoints resume to the uninterrupted run, validation
every test_freq steps, LoRA, nested prompt / response fields, row limits, the global micro-batch key."""

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import transformers
from _training_tiny import make_tiny_model_dir

from hybridrl.config import ConfigError
from hybridrl.trainer.resume_check import ResumeConfigError
from hybridrl.trainer.sft_trainer import load_sft_config, run_sft

VERL_SFT = Path(__file__).parent / "data" / "verl_sft_trainer.yaml"


def _data(path, n=16):
    rows = [{"extra_info": {"question": f"what is {i} + 2 ?", "answer": f"the answer is {i + 2}"}} for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    return make_tiny_model_dir(root / "model"), _data(root / "train.parquet")


def _keys(setup, out, *extra):
    model_dir, data = setup
    # verl's spellings: prompt/response inside a struct column, the deprecated global micro-batch, the warmup ratio
    return [f"data.train_files={data}", f"data.val_files={data}", f"model.partial_pretrain={model_dir}",
            "data.prompt_key=extra_info", "data.prompt_dict_keys=[question]", "data.response_key=extra_info",
            "+data.response_dict_keys=[answer]", "data.train_batch_size=4", "data.micro_batch_size=2",
            "data.max_length=64", "optim.lr=3e-3", "optim.lr_warmup_steps_ratio=0", "optim.lr_scheduler=cosine",
            "trainer.total_training_steps=6", "trainer.device=cpu", "trainer.log_freq=0",
            f"trainer.default_local_dir={out}", *extra]


def _weights(result):
    model = transformers.AutoModelForCausalLM.from_pretrained(result["hf_model_dir"], dtype=torch.float32)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_verls_sft_config_file_loads_with_its_defaults_left_out(caplog):
    cfg = load_sft_config(VERL_SFT)
    assert cfg.optim.warmup_steps_ratio == 0.1 and cfg.model.use_remove_padding is False
    assert list(cfg.trainer.checkpoint.contents) == ["model", "optimizer", "extra"]
    warning = next(r.getMessage() for r in caplog.records if "of verl's keys are at verl's defaults" in r.getMessage())
    assert "trainer.default_hdfs_dir" in warning and "optim._target_" not in warning   # not in sft_trainer.yaml
    assert cfg.ulysses_sequence_parallel_size == 1
    with pytest.raises(ConfigError, match=r"'data.balance_dp_token'.*each rank takes train_batch_size / world rows.*"
                                          r"verl's default, False"):
        load_sft_config(VERL_SFT, ["data.balance_dp_token=true"])
    with pytest.raises(ConfigError, match=r"'trainer.checkpoint.load_contents' = \['model'\] must equal "
                                          r"'trainer.checkpoint.contents'"):
        load_sft_config(VERL_SFT, ["trainer.checkpoint.load_contents=[model]"])


def test_a_resumed_run_ends_where_the_uninterrupted_one_does(setup, tmp_path):
    whole = run_sft(load_sft_config(overrides=_keys(setup, tmp_path / "whole", "trainer.test_freq=2",
                                                    "trainer.logger=[console,file]")))
    assert whole["training/global_step"] == 6 and whole["val/loss"] < whole["train/loss_first"]
    logged = [json.loads(line) for line in (tmp_path / "whole" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "val/loss" in r["data"]] == [2, 4, 6]   # every test_freq and the last
    assert [r["step"] for r in logged if "train/loss" in r["data"]] == [1, 2, 3, 4, 5, 6]
    cut = tmp_path / "cut"
    keys = _keys(setup, cut, "trainer.save_freq=2", "trainer.max_ckpt_to_keep=2")
    run_sft(load_sft_config(overrides=keys))
    assert sorted(p.name for p in cut.glob("global_step_*")) == ["global_step_4", "global_step_6"]   # two kept
    shutil.rmtree(cut / "global_step_6")   # as if the run had died after step 4's checkpoint
    resumed = run_sft(load_sft_config(overrides=keys))   # from step 4: steps 5 and 6
    assert resumed["training/global_step"] == 6
    assert resumed["train/loss"] == pytest.approx(whole["train/loss"], rel=1e-5)
    a, b = _weights(whole), _weights(resumed)
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=1e-6, rtol=1e-5)
    with pytest.raises(ResumeConfigError, match=r"data order changed.*data.train_batch_size: 4 in the checkpoint, "
                                                r"8 now"):
        run_sft(load_sft_config(overrides=_keys(setup, cut, "data.train_batch_size=8", "data.micro_batch_size=4")))


def test_lora_sft_trains_the_adapters_and_writes_the_merged_model(setup, tmp_path):
    base = transformers.AutoModelForCausalLM.from_pretrained(setup[0], dtype=torch.float32)
    result = run_sft(load_sft_config(overrides=_keys(setup, tmp_path / "lora", "model.lora_rank=8",
                                                     "model.lora_alpha=16", "optim.lr=1e-2")))
    assert result["train/loss"] < result["train/loss_first"]
    merged = _weights(result)
    assert not any("lora" in n for n in merged)
    moved = [n for n, p in base.named_parameters() if not torch.allclose(merged[n], p)]
    assert moved and all("proj" in n for n in moved)   # only the adapted linears changed


def test_row_limits_and_bad_values_name_their_keys(setup, tmp_path):
    short = run_sft(load_sft_config(overrides=_keys(setup, tmp_path / "short", "data.train_max_samples=8",
                                                    "trainer.total_training_steps=null", "trainer.total_epochs=1")))
    assert short["training/global_step"] == 2   # 8 rows, 4 a step
    with pytest.raises(ValueError, match=r"data.micro_batch_size=0 must be a positive multiple of the data-parallel size 1"):
        run_sft(load_sft_config(overrides=_keys(setup, tmp_path / "x", "data.micro_batch_size=0")))
    with pytest.raises(ValueError, match="data.train_max_samples / val_max_samples = 0"):
        run_sft(load_sft_config(overrides=_keys(setup, tmp_path / "y", "data.train_max_samples=0")))


def _sp_rank(rank, world, keys):
    run_sft(load_sft_config(overrides=keys))


def test_ulysses_sft_on_two_ranks_trains_as_one_rank(setup, tmp_path):
    """ulysses_sequence_parallel_size=2 on 2 gloo ranks (one data-parallel rank whose tokens the two split) gives
    the weights one rank trains on the same rows."""
    from _training_tiny import run_ranks

    one = run_sft(load_sft_config(overrides=_keys(setup, tmp_path / "one", "trainer.total_training_steps=2",
                                                  "use_remove_padding=true")))
    keys = _keys(setup, tmp_path / "sp", "trainer.total_training_steps=2", "use_remove_padding=true",
                 "ulysses_sequence_parallel_size=2", "trainer.save_freq=2")
    run_ranks(_sp_rank, 2, keys)
    # both ranks wrote their shards of the step-2 checkpoint; rank 0 committed it
    assert sorted(p.name for p in (tmp_path / "sp" / "global_step_2").glob("extra_state_*")) == [
        "extra_state_world_size_2_rank_0.pt", "extra_state_world_size_2_rank_1.pt"]
    assert (tmp_path / "sp" / "global_step_2" / "COMPLETE").exists()
    a = _weights(one)
    b = _weights({"hf_model_dir": str(tmp_path / "sp" / "huggingface")})
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="ulysses_sequence_parallel_size=2 must be >= 1 and divide the world size 1"):
        run_sft(load_sft_config(overrides=[*keys, f"trainer.default_local_dir={tmp_path / 'sp1'}"]))


def test_an_export_only_sft_checkpoint_is_no_resume_point(setup, tmp_path):
    keys = _keys(setup, tmp_path / "export", "trainer.total_training_steps=2", "trainer.save_freq=2",
                 "trainer.checkpoint.save_contents=[hf_model]", "trainer.checkpoint.load_contents=[hf_model]")
    run_sft(load_sft_config(overrides=keys))
    step = tmp_path / "export" / "global_step_2"
    assert (step / "huggingface" / "model.safetensors").exists() and not (step / "model").exists()
    with pytest.raises(ResumeConfigError, match=r"'trainer.checkpoint.contents' = \['hf_model'\], without 'model'"):
        run_sft(load_sft_config(overrides=keys))
