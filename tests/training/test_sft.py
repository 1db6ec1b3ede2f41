"""SFT on a tiny synthetic parquet (in-process, CPU, one rank): the loss goes down, a HF model dir comes out."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import transformers
from _training_tiny import make_tiny_model_dir

from hybridrl.trainer.sft_trainer import load_sft_config, run_sft, tokenize_examples


def _write_parquet(path, n=16):
    rows = [{"prompt": [{"role": "user", "content": f"what is {i} + 2 ?"}], "answer": f"the answer is {i + 2}",
             "extra_info": {"answer": f"{i + 2}"}} for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_sft_lowers_loss_and_writes_hf_model(tmp_path):
    model_dir = make_tiny_model_dir(tmp_path / "model")
    data = _write_parquet(tmp_path / "train.parquet")
    cfg = load_sft_config(overrides=[f"data.train_files={data}", f"data.val_files={data}",
                                     f"model.partial_pretrain={model_dir}", "data.train_batch_size=8",
                                     "data.micro_batch_size_per_gpu=3", "data.max_length=64", "optim.lr=3e-3",
                                     "optim.warmup_steps_ratio=0", "optim.lr_scheduler=constant",
                                     "trainer.total_epochs=4", "trainer.device=cpu", "trainer.log_freq=0",
                                     f"trainer.default_local_dir={tmp_path / 'out'}"])
    result = run_sft(cfg)
    assert result["training/global_step"] == 8 and result["data/dropped_rows"] == 0
    assert result["train/loss"] < 0.7 * result["train/loss_first"]
    assert result["val/loss"] < result["train/loss_first"]
    model = transformers.AutoModelForCausalLM.from_pretrained(result["hf_model_dir"], dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(result["hf_model_dir"])
    assert model.config.vocab_size >= len(tok) and not torch.distributed.is_initialized()


def test_tokenize_examples_truncation_is_counted_or_an_error(tmp_path):
    tok = transformers.AutoTokenizer.from_pretrained(make_tiny_model_dir(tmp_path / "m", with_tokenizer=True))
    rows = [{"messages": [{"role": "user", "content": "what is 1 + 2 ?"}], "response": "the answer is 3"}]
    (p, r, m), = tokenize_examples(rows, tok, 200, "error")[0]
    assert r[-1] == tok.eos_token_id and tok.decode(r[:-1]) == "the answer is 3" and m == [1] * len(r)
    assert tok.decode(p).endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="data.max_length=10"):
        tokenize_examples(rows, tok, 10, "error")
    out, n = tokenize_examples(rows, tok, len(p) + 2, "right")
    assert n == 1 and len(out[0][1]) == 2 and out[0][0] == p and out[0][2] == [1, 1]


def test_sft_use_liger_where_it_cannot_run_is_refused_naming_the_key(tmp_path):
    from hybridrl.config import ConfigError

    model_dir = make_tiny_model_dir(tmp_path / "model")
    data = _write_parquet(tmp_path / "train.parquet")
    keys = [f"data.train_files={data}", f"model.partial_pretrain={model_dir}", "data.train_batch_size=8",
            "trainer.device=cpu", f"trainer.default_local_dir={tmp_path / 'out'}"]
    with pytest.raises(ConfigError, match=r"'model.use_liger' = 'maybe' is not one of \['auto', True, False\]"):
        load_sft_config(overrides=[*keys, "model.use_liger=maybe"])  # refused when loaded
    cfg = load_sft_config(overrides=[*keys, "model.use_liger=true"])
    with pytest.raises(ConfigError) as e:
        run_sft(cfg)
    assert "'model.use_liger'" in str(e.value) and "the device is the CPU" in str(e.value)
    assert not torch.distributed.is_initialized()
