"""After loading, the code reads the typed config: no module outside hybridrl/config/ imports omegaconf (the loader
merges and resolves YAML with it, then builds the frozen sections once), and the training layer (hybridrl/training/)
takes the typed sections: it reads no config with `.get(key, default)` (a default there would be a second one, beside
the packaged YAML's) and its constructors refuse plain dicts."""

import ast
import re
from pathlib import Path

import pytest
import torch

import hybridrl

PACKAGE = Path(hybridrl.__file__).parent
# a name that holds a config: cfg, config, optim_cfg, model_config, self.config, fsdp_cfg ...
CONFIG_NAME = re.compile(r"(^|_)(cfg|config|conf)$")


def omegaconf_imports(source: str) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(source)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        lines += [node.lineno for name in names if name.split(".")[0] == "omegaconf"]
    return lines


def test_only_the_config_package_imports_omegaconf():
    offenders = [f"hybridrl/{p.relative_to(PACKAGE)}:{line}" for p in sorted(PACKAGE.rglob("*.py"))
                 if p.relative_to(PACKAGE).parts[0] != "config"
                 for line in omegaconf_imports(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_the_scan_finds_both_import_forms():
    assert omegaconf_imports("import omegaconf\nfrom omegaconf import OmegaConf\ndef f():\n    import os\n") == [1, 2]


def _names(node: ast.AST) -> list[str]:
    """The identifiers of a receiver expression: `self.config.policy_loss` -> [policy_loss, config, self]; a call's
    or subscript's receiver is followed (`(cfg.get("a") or {})` is a BoolOp, whose operands are scanned too)."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr, *_names(node.value)]
    if isinstance(node, (ast.Subscript, ast.Call)):
        return _names(node.value if isinstance(node, ast.Subscript) else node.func)
    if isinstance(node, ast.BoolOp):
        return [name for value in node.values for name in _names(value)]
    return []


def config_gets(source: str) -> list[int]:
    """Lines calling `.get(` on something a config name leads to (`cfg.get`, `self.config.x.get`,
    `(model_cfg.get("a") or {}).get`); dicts of other kinds (meta_info, kwargs, state dicts) are not configs."""
    return sorted(node.lineno for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and any(CONFIG_NAME.search(name) for name in _names(node.func.value)))


def test_the_training_layer_reads_no_config_with_get():
    offenders = [f"hybridrl/{p.relative_to(PACKAGE)}:{line}" for p in sorted((PACKAGE / "training").rglob("*.py"))
                 for line in config_gets(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_the_get_scan_finds_config_reads_and_passes_other_dicts():
    source = ("cfg.get('a', 1)\nself.config.get('b')\noptim_cfg.get('lr')\n(model_cfg.get('m') or {}).get('x')\n"
              "self.config.policy_loss.get('loss_mode')\nmeta.get('micro_batch_size')\nkwargs.get('sp_group')\n"
              "state.get('extra', {})\nself.configure.get('x')\n")
    assert config_gets(source) == [1, 2, 3, 4, 4, 5]


def test_training_constructors_refuse_plain_dicts():
    from hybridrl.training import DataParallelPPOActor, DataParallelPPOCritic, build_fsdp_model
    from hybridrl.training.lora import lora_settings
    from hybridrl.training.moe import router_settings
    from hybridrl.training.optim import build_lr_scheduler, build_optimizer

    model = torch.nn.Linear(2, 2)
    for make in (lambda: DataParallelPPOActor({"ppo_mini_batch_size": 4}, model),
                 lambda: DataParallelPPOCritic({"ppo_mini_batch_size": 4}, model),
                 lambda: build_optimizer(model.parameters(), {"lr": 1e-3}),
                 lambda: build_lr_scheduler(torch.optim.SGD(model.parameters(), lr=1.0), {"lr": 1e-3}),
                 lambda: build_fsdp_model({"path": "x"}, {"model_dtype": "fp32"}, None, "cpu")):
        with pytest.raises(TypeError, match="typed|ModelSource"):
            make()
    for read in (lambda: lora_settings({"lora_rank": 0}), lambda: router_settings({})):
        with pytest.raises(AttributeError):  # read by attribute: a dict has none of the keys
            read()
