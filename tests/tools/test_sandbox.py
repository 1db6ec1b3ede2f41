"""The sandbox: normal runs, and escape attempts each contained and reported (network, writes outside the work
directory, exec, ctypes, fork bombs, memory hogs, infinite loops, huge output)."""

import ast
import os
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from hybridrl.tools.sandbox import SandboxStats, isolation_report, run_python
from hybridrl.tools.sandbox_bootstrap import BOOTSTRAP

REPO = Path(__file__).resolve().parents[2]


def _alive_with_uid(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                status = Path(f"/proc/{name}/status").read_text()
            except OSError:
                continue
            fields = dict(ln.split(":", 1) for ln in status.splitlines() if ":" in ln)
            if fields.get("Uid", "").split()[:1] == [str(uid)] and not fields["State"].strip().startswith("Z"):
                pids.append(int(name))
    return pids


def test_normal_code_returns_stdout_and_cleans_up():
    stats = SandboxStats()
    r = run_python("import os, sys\nprint(sum(range(10)))\nprint(os.getcwd())\nprint(sys.stdin.read().upper())",
                   stdin="abc", stats=stats)
    assert r.ok, r
    total, cwd, echoed = r.stdout.splitlines()
    assert (total, echoed) == ("45", "ABC")
    assert cwd == os.path.realpath(r.workdir) and not os.path.exists(r.workdir)  # the temp dir is gone
    assert stats.as_dict()["sandbox/ok"] == 1 and stats.runs == 1


def test_no_inherited_secrets(monkeypatch):
    monkeypatch.setenv("HYBRIDRL_TEST_SECRET", "hunter2")
    r = run_python("import os\nprint(sorted(os.environ))")
    assert r.ok and "HYBRIDRL_TEST_SECRET" not in r.stdout and "hunter2" not in r.stdout


def test_the_program_sees_only_the_minimal_environment_and_the_bootstrap():
    """The launcher's plan (on its argv) is gone after its exec: the program gets exactly the minimal environment,
    the bootstrap's command line, and no descriptors beyond the streams, the status pipe and the values channel."""
    code = ("import os, sys\nfds = []\nfor fd in range(64):\n    try:\n        os.fstat(fd)\n        fds.append(fd)\n"
            "    except OSError:\n        pass\nprint(repr((dict(os.environ), sys.orig_argv, len(fds))))")
    r = run_python(code, values=True)
    assert r.ok, r
    env, argv, n_fds = ast.literal_eval(r.stdout)
    assert env == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": r.workdir,
                   "TMPDIR": r.workdir}
    assert argv == [os.path.realpath(sys.executable), "-I", "-S", "-B", "-c", BOOTSTRAP]
    assert n_fds == 5


# Holds a lock in one thread and installs an audit hook that takes it in any forked copy of this process: Python
# code run between fork and exec (a preexec_fn) would wait for it forever, as on any lock held at the fork.
LOCK_HELD_AT_FORK = """
import os, sys, threading
from hybridrl.tools.sandbox import isolation_report, run_python
isolation_report()
held, parent, ready, done = threading.Lock(), os.getpid(), threading.Event(), threading.Event()
def hook(event, args):
    if os.getpid() != parent:
        with held:
            pass
sys.addaudithook(hook)
def holder():
    with held:
        ready.set()
        done.wait()
threading.Thread(target=holder, daemon=True).start()
ready.wait()
r = run_python("print('ran')", timeout_s=10)
done.set()
print(r.ok, r.stdout.strip())
"""


def test_a_lock_held_by_another_thread_does_not_stop_the_launch():
    """No Python runs in the forked child: a parent thread holding a lock at fork time cannot hang the run. In a
    fresh process, as an audit hook cannot be removed."""
    path = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    out = subprocess.run([sys.executable, "-c", LOCK_HELD_AT_FORK], env=env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0 and out.stdout.split() == ["True", "ran"], out


def test_a_failing_layer_stops_the_run_before_the_code(monkeypatch, tmp_path):
    if not isolation_report()["mount_namespace"]:
        pytest.skip("no mount namespace on this machine")
    from hybridrl.tools import sandbox
    from hybridrl.tools.sandbox_layers import Bind, python_view

    missing = str(tmp_path / "missing")  # a bind whose source does not exist: the mount layer fails
    monkeypatch.setattr(sandbox, "python_view", lambda work: [*python_view(work), Bind(missing, "ro")])
    stats = SandboxStats()
    r = run_python("print('ran')", stats=stats)
    assert not r.ok and r.exit_code == 126 and r.killed_reason == "layer_failed" and "ran" not in r.stdout, r
    assert r.isolation["failed"] == f"mount_namespace: [Errno 2] bind {missing}" and not r.isolation["applied"]
    assert stats.crashes == 1


def test_exception_is_a_counted_crash():
    stats = SandboxStats()
    r = run_python("raise ValueError('boom')", stats=stats)
    assert not r.ok and r.exit_code == 1 and r.killed_reason is None and "ValueError: boom" in r.stderr
    assert stats.crashes == 1


@pytest.fixture
def listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    accepted = []
    threading.Thread(target=lambda: accepted.append(srv.accept()), daemon=True).start()
    yield srv.getsockname()[1], accepted
    srv.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "8.8.8.8"])
def test_network_refused(listener, host):
    port, accepted = listener
    target = port if host == "127.0.0.1" else 53
    stats = SandboxStats()
    r = run_python(f"import socket\ns = socket.create_connection(({host!r}, {target}), timeout=2)\nprint('connected')",
                   stats=stats, timeout_s=5)
    assert not r.ok and "connected" not in r.stdout and not accepted
    assert r.killed_reason == "refused" and any(x.startswith("socket.") for x in r.refused)
    assert stats.refused_runs == 1 and stats.refused_ops >= 1


def test_network_namespace_without_the_hook(listener):
    """The kernel layer alone (audit hook off): the loopback listener of the parent is unreachable."""
    if not isolation_report()["net_namespace"]:
        pytest.skip("no network namespace on this machine (unshare(CLONE_NEWNET) not permitted)")
    port, accepted = listener
    r = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')",
                   audit_hook=False, timeout_s=5)
    assert not r.ok and "connected" not in r.stdout and not accepted and r.isolation["net_namespace"]


def test_writing_outside_the_work_dir_fails():
    name = f"escape_{uuid.uuid4().hex}"
    targets = [Path("/tmp") / name, REPO / name, Path("/tmp") / (name + "_dirfd")]
    code = f"""
import os
results = []
for path in [{str(targets[0])!r}, {str(targets[1])!r}, '../' * 10 + 'tmp/{name}']:
    try:
        with open(path, 'w') as f:
            f.write('x')
        results.append('wrote')
    except PermissionError:
        results.append('refused')
try:
    d = os.open('/tmp', os.O_RDONLY)
    os.close(os.open('{name}_dirfd', os.O_CREAT | os.O_WRONLY, dir_fd=d))
    results.append('wrote')
except PermissionError:
    results.append('refused')
for op in (lambda: os.mkdir('/tmp/{name}_dir'), lambda: os.remove({str(REPO / 'README.md')!r}),
           lambda: os.rename('/tmp', '/tmp2')):
    try:
        op()
        results.append('done')
    except PermissionError:
        results.append('refused')
with open('inside.txt', 'w') as f:  # its own directory is fine
    f.write('ok')
print(results, open('inside.txt').read())
"""
    r = run_python(code)
    assert r.ok, r
    assert r.stdout.strip() == "['refused', 'refused', 'refused', 'refused', 'refused', 'refused', 'refused'] ok"
    assert len(r.refused) == 7
    for t in [*targets, Path(f"/tmp/{name}_dir")]:
        assert not t.exists()
    assert (REPO / "README.md").exists()


def test_exec_and_ctypes_refused():
    for code in ("import os\nos.system('echo hi > /tmp/x')", "import subprocess\nsubprocess.run(['true'])",
                 "import os\nos.execv('/bin/true', ['true'])", "import ctypes\nctypes.CDLL(None)"):
        r = run_python(code)
        assert not r.ok and r.killed_reason == "refused" and r.refused, (code, r)


def test_infinite_loop_times_out():
    stats = SandboxStats()
    r = run_python("while True:\n    pass", timeout_s=1.0, stats=stats)
    assert r.timed_out and r.killed_reason == "timeout" and not r.ok and r.wall_s < 3
    assert stats.timeouts == 1


def test_cpu_limit():
    r = run_python("while True:\n    pass", timeout_s=10.0, cpu_s=1)
    assert r.killed_reason == "cpu" and not r.timed_out and r.wall_s < 5


def test_memory_hog_is_killed():
    stats = SandboxStats()
    r = run_python("x = bytearray(2 * 1024 ** 3)\nprint('allocated')", memory_mb=128, stats=stats)
    assert not r.ok and r.killed_reason == "memory" and "allocated" not in r.stdout
    r = run_python("a = []\nwhile True:\n    a.append(' ' * 10 ** 6)", memory_mb=128, timeout_s=10, stats=stats)
    assert r.killed_reason == "memory" and r.wall_s < 5
    assert stats.memory_kills == 2


def test_file_size_limit():
    r = run_python("with open('big', 'wb') as f:\n    f.write(b'x' * (3 << 20))", max_file_mb=1)
    assert not r.ok and r.killed_reason == "file_size"


def test_huge_output_is_truncated():
    r = run_python("import sys\nfor _ in range(200):\n    sys.stdout.write('y' * 100000)", max_output_bytes=10000)
    assert r.ok and r.stdout_truncated and r.stdout == "y" * 10000


def test_fork_bomb_is_bounded_and_cleaned_up():
    iso = isolation_report()
    if not iso["rlimit_nproc_enforced"]:
        pytest.skip("RLIMIT_NPROC is not enforced here (root without a uid drop): a fork bomb would not be bounded")
    # count how many processes the run can hold at once: each child sleeps, so none frees its slot
    counting = """
import os, time
children, failures = 0, 0
for _ in range(60):
    try:
        pid = os.fork()
    except OSError:
        failures += 1
        continue
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    children += 1
print(children, failures)
"""
    r = run_python(counting, max_procs=8, timeout_s=5)
    assert r.ok, r
    children, failures = map(int, r.stdout.split())
    assert children <= 8 and failures >= 52
    assert not _alive_with_uid(r.isolation["uid"])  # the sleepers were killed with the group
    # the classic bomb: bounded by the limit, stopped by the timeout, nothing left behind
    r = run_python("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                   max_procs=8, timeout_s=1.5)
    assert r.timed_out and r.wall_s < 5
    assert not _alive_with_uid(r.isolation["uid"])


def test_escape_from_the_process_group_is_still_killed():
    if not isolation_report()["uid_dropped"]:
        pytest.skip("no per-run uid on this machine")
    r = run_python("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')",
                   timeout_s=5)
    assert r.ok and "parent done" in r.stdout
    assert not _alive_with_uid(r.isolation["uid"])
