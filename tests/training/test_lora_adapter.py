"""actor_rollout_ref.model.lora_adapter_path: a peft adapter directory (as `hybridrl merge` writes one) that the
actor's LoRA starts from. Its config decides the LoRA keys; its weights load into the injected adapters and act as
peft's own PeftModel.from_pretrained of the same directory does; an adapter that does not fit is refused by name."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybridrl.config import ConfigError, load_config
from hybridrl.config.lora_adapter import adapter_lora_keys
from hybridrl.training.lora import LoraSettings, apply_lora, load_adapter_weights
from hybridrl.training.merge import write_lora_adapter

M = "actor_rollout_ref.model"


def trained_adapter(model_dir, out, rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj")):
    """A LoRA model whose adapters are random (B too, so they change the output), and its adapter directory."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    settings = LoraSettings(rank, alpha, tuple(targets))
    model = apply_lora(model, settings, adapter_dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.normal_(0, 0.2)
    write_lora_adapter(model.state_dict(), settings.to_json(), out, "float32")
    return model, settings


def test_loaded_adapters_act_as_peft_loads_them(tiny_model_dir, tmp_path):
    from peft import PeftModel

    trained, settings = trained_adapter(tiny_model_dir, tmp_path / "adapter")
    ids = torch.randint(3, 200, (2, 12))
    fresh = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                       LoraSettings(settings.rank, settings.alpha, settings.target_modules,
                                    adapter_path=str(tmp_path / "adapter")), adapter_dtype=torch.float32)
    base_logits = fresh(ids).logits.detach().clone()   # adapters at peft's init: B = 0, the base's output
    load_adapter_weights(fresh, str(tmp_path / "adapter"))
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                                     str(tmp_path / "adapter"))
    with torch.no_grad():
        ours, theirs, original = fresh(ids).logits, peft(ids).logits, trained(ids).logits
    assert (ours - base_logits).abs().max() > 1e-2          # the loaded adapters change the output
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours, original, rtol=1e-5, atol=1e-5)


def test_an_adapter_that_does_not_fit_is_refused_naming_the_keys(tiny_model_dir, tmp_path):
    trained_adapter(tiny_model_dir, tmp_path / "r8", rank=8)
    other_rank = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                            LoraSettings(4, 8.0, ("q_proj", "v_proj", "down_proj")))
    with pytest.raises(ValueError, match=r"lora_adapter_path=.*of another shape: \['model.layers.0"):
        load_adapter_weights(other_rank, str(tmp_path / "r8"))
    fewer_targets = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                               LoraSettings(8, 8.0, ("q_proj",)))
    with pytest.raises(ValueError, match=r"not adapters of the model: \['model.layers.0.mlp.down_proj"):
        load_adapter_weights(fewer_targets, str(tmp_path / "r8"))


def test_the_adapters_config_decides_the_lora_keys(tiny_model_dir, tmp_path):
    trained_adapter(tiny_model_dir, tmp_path / "adapter", rank=4, alpha=8.0)
    cfg = load_config(overrides=[f"{M}.lora_adapter_path={tmp_path / 'adapter'}"])
    m = cfg.actor_rollout_ref.model
    assert (m.lora_rank, m.lora_alpha, m.target_modules, m.target_parameters) == (4, 8.0, ["down_proj", "q_proj",
                                                                                            "v_proj"], None)
    assert load_config(overrides=[f"{M}.lora_adapter_path={tmp_path / 'adapter'}", f"{M}.lora_rank=4"])
    with pytest.raises(ConfigError, match=r"'actor_rollout_ref.model.lora_rank' = 16 but the adapter .* has r = 4"):
        load_config(overrides=[f"{M}.lora_adapter_path={tmp_path / 'adapter'}", f"{M}.lora_rank=16"])


@pytest.mark.parametrize("change,rule", [({"use_dora": True}, "DoRA"), ({"bias": "all"}, "bias must be 'none'"),
                                         ({"peft_type": "IA3"}, "only LoRA adapters"), ({"r": 0}, "positive integer")])
def test_adapters_the_actor_cannot_run_are_refused(tiny_model_dir, tmp_path, change, rule):
    trained_adapter(tiny_model_dir, tmp_path / "adapter")
    config_file = tmp_path / "adapter" / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **change}))
    with pytest.raises(ConfigError, match=rule):
        adapter_lora_keys(str(tmp_path / "adapter"))


def test_a_directory_without_an_adapter_is_named(tmp_path):
    with pytest.raises(ConfigError, match=rf"'{M}.lora_adapter_path' = '{tmp_path}': no adapter_config.json there"):
        load_config(overrides=[f"{M}.lora_adapter_path={tmp_path}"])
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(ConfigError, match="no adapter weights"):
        load_config(overrides=[f"{M}.lora_adapter_path={tmp_path}"])


@pytest.mark.parametrize("exclude", [["model.layers.0.self_attn.q_proj"], r".*layers\.1\..*"],
                         ids=["names", "regex"])
def test_excluded_modules_get_no_adapter_as_in_peft(tiny_model_dir, tmp_path, exclude):
    """model.exclude_modules (peft's key, which verl passes on): the same modules are adapted as peft's own LoRA
    with that key adapts; the merged adapter directory keeps it, and a run starting from it reads it back."""
    from peft import LoraConfig, get_peft_model

    def adapted(model):
        return {name.removeprefix("base_model.model.").rpartition(".lora_A")[0]
                for name, _ in model.named_parameters() if ".lora_A." in name}

    targets = ("q_proj", "v_proj", "down_proj")
    settings = LoraSettings(4, 8.0, targets, exclude_modules=exclude if isinstance(exclude, str) else tuple(exclude))
    ours = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), settings)
    theirs = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                            LoraConfig(r=4, lora_alpha=8, target_modules=list(targets), exclude_modules=exclude))
    assert adapted(ours) == adapted(theirs) and len(adapted(ours)) < 3 * 2   # 2 layers x 3 targets, some excluded
    write_lora_adapter(ours.state_dict(), settings.to_json(), tmp_path / "adapter", "float32")
    cfg = load_config(overrides=[f"{M}.lora_adapter_path={tmp_path / 'adapter'}"])
    assert cfg.actor_rollout_ref.model.exclude_modules == (exclude if isinstance(exclude, str) else sorted(exclude))
