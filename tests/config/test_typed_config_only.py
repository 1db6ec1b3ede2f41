"""After loading, the code reads the typed config: no module outside hybridrl/config/ imports omegaconf (the loader
merges and resolves YAML with it, then builds the frozen sections once)."""

import ast
from pathlib import Path

import hybridrl

PACKAGE = Path(hybridrl.__file__).parent


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
