"""Escape attempts a hostile program makes from inside the sandbox, each asserted to fail: reading files the
parent can read, switching the in-process audit hook off and then writing outside, running programs and calling
libc through ctypes. The kernel layers must hold with the hook off."""

import os
import sys
import uuid
from pathlib import Path

import pytest

from hybridrl.tools.sandbox import isolation_report, run_python

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the secret files are root-owned and the "
                                                         "per-run uid drop only happens as root")

# Replaces every function in the bootstrap's closures with a no-op and empties its sets: what a program finds
# through gc.get_objects() to disarm the audit hook. Prints how many cells it replaced.
DISARM = """
import gc, types
replaced = 0
for o in gc.get_objects():
    if isinstance(o, types.FunctionType) and o.__code__.co_filename == '<string>' and o.__closure__:
        for cell in o.__closure__:
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            if callable(v) and not isinstance(v, type):
                cell.cell_contents = lambda *a, **k: None
                replaced += 1
            elif isinstance(v, set):
                v.clear()
                replaced += 1
print('disarmed', replaced, flush=True)
"""


@pytest.fixture
def root_secret(tmp_path):
    """A 0600 root file in a 0700 directory: only root with its capabilities may read it."""
    d = tmp_path / "private"
    d.mkdir(mode=0o700)
    secret = d / "secret.txt"
    secret.write_text("TOP-SECRET-" + uuid.uuid4().hex)
    secret.chmod(0o600)
    return secret


def _read_attempt(path: Path) -> str:
    return f"""
try:
    print('READ', open({str(path)!r}).read()[:64])
except OSError as e:
    print('FAILED', type(e).__name__)
"""


@ROOT_ONLY
@pytest.mark.parametrize("audit_hook", [True, False])
def test_root_only_files_are_not_readable(root_secret, audit_hook):
    for path in (root_secret, Path("/etc/shadow")):
        r = run_python(_read_attempt(path), audit_hook=audit_hook)
        assert r.ok, r
        assert r.stdout.startswith("FAILED"), (path, r.stdout)
    assert root_secret.read_text() not in r.stdout


def test_the_disarmed_hook_no_longer_refuses():
    """The attack does switch the hook off (importing ctypes, which it refuses, then works), so the escapes below
    meet the kernel layers alone."""
    armed = run_python("import ctypes")
    assert armed.killed_reason == "refused" and armed.refused
    r = run_python(DISARM + "import ctypes\nprint('ctypes', ctypes.sizeof(ctypes.c_int))")
    assert r.ok and "ctypes 4" in r.stdout and not r.refused, r


@pytest.mark.parametrize("attempt", ["write_tmp", "write_repo", "os_system", "ctypes_system", "ctypes_execve"])
def test_disarmed_hook_escapes_still_fail(attempt, tmp_path):
    outside = Path("/tmp") / f"escape_{uuid.uuid4().hex}"
    repo_file = Path(__file__).resolve().parents[2] / f"escape_{uuid.uuid4().hex}"
    code = {
        "write_tmp": f"open({str(outside)!r}, 'w').write('x')",
        "write_repo": f"open({str(repo_file)!r}, 'w').write('x')",
        "os_system": f"import os\nrc = os.system('touch {outside}')\nprint('rc', rc)\nassert rc == 0",
        "ctypes_system": f"import ctypes\nrc = ctypes.CDLL(None).system(b'touch {outside}')\nprint('rc', rc)\n"
                         "assert rc == 0",
        "ctypes_execve": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                         f"argv = (ctypes.c_char_p * 3)(b'/usr/bin/touch', b'{outside}', None)\n"
                         "rc = libc.execve(b'/usr/bin/touch', argv, None)\n"
                         "print('rc', rc, ctypes.get_errno())\nassert False",
    }[attempt]
    r = run_python(DISARM + code)
    assert "disarmed" in r.stdout, r
    assert not r.ok, r  # each attempt raises or asserts when the kernel stops it
    assert not outside.exists() and not repo_file.exists()
    outside.unlink(missing_ok=True)
    repo_file.unlink(missing_ok=True)


def _reachable_by_anyone(path: str) -> bool:
    p = Path(os.path.realpath(path))
    return all(d.stat().st_mode & 0o001 for d in p.parents) and bool(p.stat().st_mode & 0o005)


def _need(*layers):
    iso = isolation_report()
    missing = [x for x in layers if not iso[x]]
    if missing:
        pytest.skip(f"sandbox layer(s) {missing} off here: {[iso['off'].get(x) for x in missing]}")


@ROOT_ONLY
@pytest.mark.parametrize("alone, error", [(("mount_namespace",), "FileNotFoundError"),
                                          (("no_new_privs", "landlock"), "PermissionError"),
                                          (("uid_dropped", "capabilities_dropped"), "PermissionError")])
def test_each_filesystem_layer_alone_keeps_the_secret(root_secret, alone, error):
    """Defence in depth: the view, Landlock and the capability drop each stop the read by themselves."""
    _need(*alone)
    if "uid_dropped" in alone and "mount_namespace" not in alone and not _reachable_by_anyone(sys.executable):
        pytest.skip(f"{sys.executable} is not reachable by other users, so a fresh uid needs the mount namespace")
    r = run_python(_read_attempt(root_secret), audit_hook=False, layers=alone)
    assert r.ok and set(alone) <= set(r.isolation["applied"]), r
    assert r.stdout.strip() == f"FAILED {error}", r.stdout


def test_seccomp_alone_stops_running_programs(tmp_path):
    """With the host's /usr/bin in view (no mount namespace), execve itself is what fails."""
    _need("seccomp")
    outside = Path("/tmp") / f"escape_{uuid.uuid4().hex}"
    code = f"import os\nprint(os.path.exists('/usr/bin/touch'), os.system('/usr/bin/touch {outside}'))"
    r = run_python(code, audit_hook=False, layers=("no_new_privs", "seccomp"))
    assert r.ok and "seccomp" in r.isolation["applied"], r
    assert r.stdout.split() == ["True", str(127 << 8)]  # the shell could not be started
    assert not outside.exists()
    outside.unlink(missing_ok=True)


def test_required_layers_refuse_to_run_without_them(monkeypatch, tmp_path):
    from hybridrl.tools import sandbox
    from hybridrl.tools.registry import load_tool_config

    report = isolation_report()  # probed first, then seccomp is switched off as on a machine without it
    monkeypatch.setitem(sandbox._iso_cache, "seccomp", False)
    monkeypatch.setitem(sandbox._iso_cache, "off", {**report["off"], "seccomp": "test: off"})
    with pytest.raises(sandbox.SandboxUnavailableError, match=r"requires sandbox layer\(s\) \['seccomp'\].*test: off"):
        run_python("print(1)", require="all")
    monkeypatch.setenv(sandbox.REQUIRED_LAYERS_ENV, "seccomp")
    with pytest.raises(sandbox.SandboxUnavailableError, match="HYBRIDRL_SANDBOX_REQUIRED_LAYERS"):
        run_python("print(1)")
    monkeypatch.delenv(sandbox.REQUIRED_LAYERS_ENV)
    assert run_python("print(1)", require=["net_namespace"]).stdout == "1\n" or not isolation_report()["net_namespace"]
    cfg = tmp_path / "tools.yaml"
    cfg.write_text("tools:\n  - class_name: hybridrl.tools.builtin.python\n"
                   "    config: {type: native, required_layers: [seccomp]}\n")
    with pytest.raises(sandbox.SandboxUnavailableError, match=r"tools\[0\]: config.required_layers"):
        load_tool_config(cfg)
    cfg.write_text("tools:\n  - class_name: hybridrl.tools.builtin.python\n"
                   "    config: {type: native, required_layers: [selinux]}\n")
    with pytest.raises(ValueError, match=r"unknown sandbox layer\(s\) \['selinux'\]"):
        load_tool_config(cfg)


def test_layers_are_counted_in_the_metrics():
    from hybridrl.tools.sandbox import SandboxStats

    stats = SandboxStats()
    r = run_python("print(1)", stats=stats)
    metrics = stats.as_dict()
    for layer in r.isolation["applied"]:
        assert metrics[f"sandbox/layer/{layer}"] == 1
    assert metrics["sandbox/layer/user_namespace"] == ("user_namespace" in r.isolation["applied"])


def test_the_reward_config_key_refuses_at_start_and_reaches_scorer_processes(monkeypatch):
    from hybridrl.tools import sandbox
    from hybridrl.trainer.launch import _require_sandbox_layers

    report = isolation_report()
    monkeypatch.delenv(sandbox.REQUIRED_LAYERS_ENV, raising=False)
    monkeypatch.setitem(sandbox._iso_cache, "landlock", False)
    monkeypatch.setitem(sandbox._iso_cache, "off", {**report["off"], "landlock": "test: off"})
    with pytest.raises(sandbox.SandboxUnavailableError, match=r"reward_model.sandbox.required_layers requires .*"
                                                              r"\['landlock'\]"):
        _require_sandbox_layers("all")
    _require_sandbox_layers([])
    assert sandbox.REQUIRED_LAYERS_ENV not in os.environ
    _require_sandbox_layers(["no_new_privs"])
    assert os.environ[sandbox.REQUIRED_LAYERS_ENV] == "no_new_privs"  # inherited by spawned scorer processes
