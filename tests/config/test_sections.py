"""The typed config mirrors the packaged YAML: the same keys, both ways, and a loaded config builds into it."""

from omegaconf import OmegaConf

from hybridrl.config.schema import CONFIG_DIR
from hybridrl.config.sections import ROOTS, PPOConfig
from hybridrl.config.sections.base import Section, field_types


def field_paths(cls: type[Section], prefix: str = "") -> list[str]:
    out = []
    for name, ann in field_types(cls).items():
        if isinstance(ann, type) and issubclass(ann, Section):
            out += field_paths(ann, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


def yaml_paths(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out += yaml_paths(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


def test_fields_and_yaml_keys_are_the_same_in_the_same_order():
    for name, root in ROOTS.items():
        tree = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / f"{name}.yaml"), resolve=False)
        assert field_paths(root) == yaml_paths(tree), name


def test_the_defaults_build_typed_sections():
    tree = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "ppo_trainer.yaml"), resolve=True)
    cfg = PPOConfig.from_dict(tree)
    assert cfg.actor_rollout_ref.rollout.n == 8
    assert cfg.critic.ppo_epochs == cfg.actor_rollout_ref.actor.ppo_epochs
    assert cfg.to_dict() == tree
