"""Every leaf key of ppo_trainer.yaml is read by the code that acts on it, or refused there (config/limits.py).

A static check: the key's last name must occur in the package source as an attribute (`.name`, also inside a
dotted path string) or a quoted string (`get("name")`, `["name"]`). Files that only *describe* keys do not count:
the section dataclasses and schema check (types, allowed values), the docs generator, the resume comparison and validate.py's range checks — a
key read only there would be validated and documented but do nothing, which is what this test exists to catch.
"""

import re
from pathlib import Path

from omegaconf import OmegaConf

import hybridrl
from hybridrl.config.schema import CONFIG_DIR

PACKAGE = Path(hybridrl.__file__).parent
DESCRIBE_ONLY = ("config/schema.py", "config/docgen.py", "config/validate.py", "trainer/resume_check.py",
                 "config/sections/")
# keys that are handled although no code outside DESCRIBE_ONLY names them, with the reason
HANDLED_ELSEWHERE: dict[str, str] = {
    "data.dataloader_num_workers": "DataConfig.check warns where it is not 0 (verl's default is 8): prompts are "
                                   "tokenized once, batches collated in the driver, so no loader process runs",
    "critic.model.tokenizer_path": "must be the actor's tokenizer (CriticConfig.check): the critic reads the actor's "
                                   "token ids, tokenized once by the driver",
    "trainer.max_critic_ckpt_to_keep": "null or the actor's value (TrainerConfig.check): one checkpoint directory "
                                       "holds actor and critic",
}


def leaf_keys(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from leaf_keys(value, f"{prefix}{key}.")
        else:  # a free dict ({}) is one key: its entries go to the HF config unread by us
            yield f"{prefix}{key}"


def acting_source() -> str:
    files = [p for p in PACKAGE.rglob("*.py") if not p.relative_to(PACKAGE).as_posix().startswith(DESCRIBE_ONLY)]
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


def unread_keys(tree: dict, source: str, handled: dict[str, str] = HANDLED_ELSEWHERE) -> list[str]:
    unread = []
    for key in leaf_keys(tree):
        name = re.escape(key.rsplit(".", 1)[-1])
        if key not in handled and not re.search(rf"\.{name}\b|[\"']{name}[\"']", source):
            unread.append(key)
    return unread


def defaults_tree() -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "ppo_trainer.yaml"), resolve=False)


def test_every_key_of_the_default_config_is_read_by_code_that_acts_on_it():
    assert unread_keys(defaults_tree(), acting_source()) == []


def test_a_key_no_code_reads_is_caught():
    tree = defaults_tree()
    tree["trainer"]["warp_drive_factor"] = 3
    tree["actor_rollout_ref"]["actor"]["optim"]["quantum_momentum"] = 0.5
    assert sorted(unread_keys(tree, acting_source())) == ["actor_rollout_ref.actor.optim.quantum_momentum",
                                                          "trainer.warp_drive_factor"]


def test_a_key_read_only_by_describing_files_is_caught():
    """dataloader_num_workers is read only by its section's rule (which warns at non-zero values); without the
    entry saying so it would be a documented, validated key that does nothing."""
    assert "data.dataloader_num_workers" in unread_keys(defaults_tree(), acting_source(), handled={})
