"""reward_model keys with model-based rewards on: every bad value refused naming the key, the value and the rule;
none of them read (or checked) while reward_model.enable is false."""

import shutil

import pytest
from transformers import AutoTokenizer

from hybridrl.config import ConfigError, load_config


def load(policy, *extra):
    return load_config(overrides=[f"actor_rollout_ref.model.path={policy}", "trainer.n_gpus_per_node=2",
                                  "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                  "data.max_response_length=32", *extra])


@pytest.fixture(scope="module")
def other_template_rm(tiny_reward_model_dir, tmp_path_factory):
    """The tiny reward model with its own chat template (same vocabulary)."""
    path = tmp_path_factory.mktemp("rm") / "other_template"
    shutil.copytree(tiny_reward_model_dir, path)
    (path / "chat_template.jinja").write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    assert AutoTokenizer.from_pretrained(path).apply_chat_template([{"role": "user", "content": "x"}],
                                                                   tokenize=False) == "user: x\n"
    return path


def test_accepted_shapes(tiny_model_dir, tiny_reward_model_dir, other_template_rm):
    load(tiny_model_dir, "reward_model.enable=true", f"reward_model.model.path={tiny_reward_model_dir}")
    load(tiny_model_dir, "reward_model.enable=true", f"reward_model.model.path={other_template_rm}",
         f"reward_model.model.input_tokenizer={tiny_model_dir}", "data.return_raw_chat=true",
         "reward_model.micro_batch_size_per_gpu=3", "reward_model.max_length=100")
    load(tiny_model_dir, "reward_model.enable=true", "reward_model.style=judge", "data.return_raw_chat=true")
    # the deprecated global micro-batch: divided by the data-parallel size (2), as verl does
    cfg = load(tiny_model_dir, "reward_model.micro_batch_size=8")
    assert cfg.reward_model.micro_batch_size_per_gpu == 4 and cfg.reward_model.micro_batch_size is None


@pytest.mark.parametrize("extra, key, rule", [
    (["reward_model.micro_batch_size_per_gpu=0"], "reward_model.micro_batch_size_per_gpu", "'auto' or a positive"),
    (["reward_model.micro_batch_size_per_gpu=many"], "reward_model.micro_batch_size_per_gpu", "'auto' or a positive"),
    (["reward_model.max_length=0"], "reward_model.max_length", "> 0 or null"),
    (["reward_model.model.fsdp_config.fsdp_size=3"], "reward_model.model.fsdp_config.fsdp_size", "divisor"),
    (["reward_model.truncation=middle"], "reward_model.truncation", "not one of"),
    (["reward_model.style=genrm"], "reward_model.style", "not one of"),
    (["reward_model.model.input_tokenizer=POLICY"], "reward_model.model.input_tokenizer", "data.return_raw_chat"),
    (["reward_model.model.input_tokenizer=/nowhere", "data.return_raw_chat=true"],
     "reward_model.model.input_tokenizer", "must be the policy's tokenizer"),
    (["reward_model.model.path=OTHER"], "reward_model.model.input_tokenizer", "chat template differs"),
    (["reward_model.model.path=/nowhere/rm"], "reward_model.model.path", "is not a directory"),
    (["reward_model.style=judge"], "reward_model.judge.prompt_template", "data.return_raw_chat"),
    (["reward_model.style=judge", "reward_model.judge.prompt_template='{prompt}'", "data.return_raw_chat=true"],
     "reward_model.judge.prompt_template", "no {response}"),
    (["reward_model.style=judge", "reward_model.judge.score_pattern='\\d+'", "data.return_raw_chat=true"],
     "reward_model.judge.score_pattern", "exactly one"),
    (["reward_model.style=judge", "reward_model.judge.max_tokens=33", "data.return_raw_chat=true"],
     "reward_model.judge.max_tokens", "data.max_response_length = 32"),
])
def test_bad_values_are_refused_naming_key_and_rule(tiny_model_dir, tiny_reward_model_dir, other_template_rm,
                                                    extra, key, rule):
    extra = [e.replace("POLICY", str(tiny_model_dir)).replace("OTHER", str(other_template_rm)) for e in extra]
    with pytest.raises(ConfigError) as err:
        load(tiny_model_dir, "reward_model.enable=true", f"reward_model.model.path={tiny_reward_model_dir}", *extra)
    assert any(f"'{key}'" in e and rule in e for e in err.value.errors), err.value.errors


def test_nothing_is_checked_while_disabled(tiny_model_dir):
    load(tiny_model_dir, "reward_model.max_length=0", "reward_model.judge.prompt_template=x")
