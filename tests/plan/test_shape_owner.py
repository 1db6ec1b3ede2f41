"""The run's shape has one owner: outside `hybridrl/plan/` (and `hybridrl/config/`, which loads and validates the
keys) no module reads a degree key of the config or asks torch how many GPUs there are; workers and the trainer get
the world size and degrees from the run plan (plan/shape.py)."""

import ast
import re
from pathlib import Path

import hybridrl

PACKAGE = Path(hybridrl.__file__).parent
OWNERS = ("plan", "config")
DEGREE_KEYS = ("tensor_model_parallel_size", "ulysses_sequence_parallel_size", "fsdp_size", "n_gpus_per_node",
               "nnodes")
# a config path naming a degree key: "trainer.nnodes", "fsdp_size", f"{ACTOR}.fsdp_config.fsdp_size"
KEY_PATH = re.compile(r"^(?:[A-Za-z_{][\w.{}]*\.)?(?:" + "|".join(DEGREE_KEYS) + r")$")


def _string_path(node: ast.AST) -> str | None:
    """A string's text (an f-string's with each placeholder as {}), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def shape_reads(source: str) -> list[tuple[int, str]]:
    """(line, what) for each read of a degree key in `source`: an attribute (`cfg.trainer.nnodes`), a subscript
    (`t["nnodes"]`), a config path passed to a call (`g("trainer.nnodes")`, `OmegaConf.select(c, ...)`,
    `getattr(t, "nnodes")`), and each `torch.cuda.device_count()`. Messages and tables naming a key are no reads."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in DEGREE_KEYS:
            found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Subscript) and (path := _string_path(node.slice)) and KEY_PATH.match(path):
            found.append((node.lineno, f"[{path!r}]"))
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr == "device_count":
                found.append((node.lineno, f"{ast.unparse(node.func)}()"))
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if (path := _string_path(arg)) and KEY_PATH.match(path):
                    found.append((node.lineno, f"{ast.unparse(node.func)}({path!r})"))
    return found


def test_only_the_plan_reads_the_runs_shape():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in OWNERS:
            continue
        offenders += [f"hybridrl/{rel}:{line}: {what}" for line, what in shape_reads(path.read_text(encoding="utf-8"))]
    assert offenders == [], ("the run's shape (world size, FSDP / TP / SP degrees, device counts) is read outside "
                             "hybridrl/plan/; take it from the run plan (plan.parallel, plan.layout) or plan/shape.py:\n"
                             + "\n".join(offenders))


def test_the_scan_finds_each_kind_of_read():
    source = '''
def f(config, c, g, t, torch, OmegaConf, ACTOR):
    a = config.actor_rollout_ref.actor.ulysses_sequence_parallel_size
    b = t["nnodes"] * t["n_gpus_per_node"]
    d = g("actor_rollout_ref.rollout.tensor_model_parallel_size")
    e = g(f"{ACTOR}.fsdp_config.fsdp_size")
    h = OmegaConf.select(c, key="trainer.nnodes")
    i = torch.cuda.device_count()
    raise ValueError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={d} must divide the world size")
NOTES = {"trainer.nnodes": "a message about the key, not a read"}
KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
'''
    assert sorted(line for line, _ in shape_reads(source)) == [3, 4, 4, 5, 6, 7, 8]
