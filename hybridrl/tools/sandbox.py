"""`run_python`: run untrusted Python (a tool call, a generated solution under test) in a throw-away sandbox process.

**Best effort, not a security boundary.** This contains the accidents and casual escapes that RL rollouts produce
(infinite loops, fork and memory bombs, huge prints, a stray `requests.get`, writing files all over the disk); it
does not stop a determined attacker. Layers, each reported in `SandboxResult.isolation`:

- A fresh interpreter (`python -I -S -B`: no user site, no site-packages, no environment variables honoured, no
  bytecode written) with a minimal environment (nothing inherited: no tokens or keys), stdin from a file or
  /dev/null, cwd = a new temporary directory deleted afterwards.
- Resource limits set in the child before exec (`resource.setrlimit`): CPU seconds (RLIMIT_CPU, SIGXCPU), address
  space (RLIMIT_AS: allocations fail with MemoryError), file size (RLIMIT_FSIZE), processes (RLIMIT_NPROC) and
  open files (RLIMIT_NOFILE); a wall-clock timeout that SIGKILLs the whole process group (`start_new_session`).
- `net_namespace`: when the parent may (root, or CAP_SYS_ADMIN), the child calls `unshare(CLONE_NEWNET)`: a new,
  empty network namespace (only a down loopback), so no connection can be made even by code bypassing the hook.
- `uid_dropped`: when the parent is root, the child switches to a fresh unprivileged uid (one per run, so
  RLIMIT_NPROC, which root ignores, counts only this run's processes, and leftovers are found by uid and killed)
  keeping only CAP_DAC_READ_SEARCH (ambient), so an interpreter under an unreadable /root still starts. The kernel
  then refuses writes to root-owned files; world-writable places (/tmp) are left to the audit hook.
- `audit_hook`: the bootstrap installs a `sys.addaudithook` hook before the user's code runs that refuses socket
  creation, opening for writing (and remove/rename/mkdir/chmod/...) outside the work directory, exec/spawn/system/
  subprocess (an exec'd program would lose the hook), and importing `ctypes` (with ctypes the hook can be bypassed
  by calling libc directly; the hook itself can also be sidestepped by other interpreter tricks — it is a guard
  rail). Each refusal raises PermissionError in the child and is reported back (`SandboxResult.refused`).

Without root none of the kernel layers is available and only the hook and the rlimits remain (RLIMIT_NPROC then
counts all processes of the calling user). Counted outcomes: `SandboxResult.killed_reason` and `SandboxStats`.
preexec_fn is used, so call this from threads with care (Python warns that preexec_fn may deadlock if another
thread holds a lock the child needs; the preexec here uses only pre-loaded functions).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

__all__ = ["SandboxResult", "SandboxStats", "isolation_report", "run_python"]

CLONE_NEWNET = 0x40000000
_PR_SET_KEEPCAPS = 8
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_RAISE = 2
_CAP_DAC_READ_SEARCH = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_UID_BASE = 1_500_000_000  # well above any real account; one uid per run
_UID_SPAN = 100_000_000

EXIT_MEMORY = 101
EXIT_REFUSED = 102
EXIT_FILE_SIZE = 103

_BOOTSTRAP = r'''
import os, sys
def _sandbox_setup():
    fd = int(os.environ.pop("HYBRIDRL_SANDBOX_FD", "-1"))
    hook_on = os.environ.pop("HYBRIDRL_SANDBOX_HOOK", "1") == "1"
    work = os.path.realpath(os.getcwd())
    with open("main.py", encoding="utf-8") as f:
        src = f.read()
    os.remove("main.py")
    code = compile(src, "main.py", "exec")
    getcwd, realpath, join, fspath, fsdecode = os.getcwd, os.path.realpath, os.path.join, os.fspath, os.fsdecode
    isdir, owrite, sep = os.path.isdir, os.write, os.sep
    wflags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    notes = [0]

    class SandboxRefused(PermissionError):
        pass

    def resolve(p):
        p = fspath(p)
        if isinstance(p, bytes):
            p = fsdecode(p)
        return realpath(join(getcwd(), p))

    def inside(p):
        if isinstance(p, int):
            return True  # an already open descriptor
        r = resolve(p)
        return r == work or r.startswith(work + sep)

    def refuse(event, detail):
        if fd >= 0 and notes[0] < 50:
            notes[0] += 1
            try:
                owrite(fd, ("refused %s %s\n" % (event, detail))[:400].encode("utf-8", "replace"))
            except OSError:
                pass
        raise SandboxRefused("sandbox refused %s (%s)" % (event, detail))

    one_path = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
                "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr", "shutil.rmtree"}
    with_dir_fd = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.utime", "shutil.rmtree"}
    two_paths = {"os.rename", "os.link"}
    blocked_modules = {"ctypes", "_ctypes", "_posixsubprocess"}

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int) or inside(path):
                return
            writing = bool((flags or 0) & wflags) or (isinstance(mode, str) and any(c in mode for c in "wax+"))
            if writing and resolve(path) != "/dev/null":
                refuse("open", "writing outside the work directory: %r" % (path,))
            if not writing and isdir(path):
                refuse("open", "a directory outside the work directory (dir_fd escape): %r" % (path,))
        elif event.startswith("socket."):
            refuse(event, "no network in the sandbox")
        elif event in one_path:
            if event in with_dir_fd and args[-1] not in (None, -1):
                refuse(event, "dir_fd")
            if not inside(args[0]):
                refuse(event, "outside the work directory: %r" % (args[0],))
        elif event in two_paths or event == "os.symlink":
            targets = args[:2] if event in two_paths else args[1:2]
            if any(a not in (None, -1) for a in args[2:]):
                refuse(event, "dir_fd")
            for p in targets:
                if not inside(p):
                    refuse(event, "outside the work directory: %r" % (p,))
        elif event in ("os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen", "os.startfile"):
            refuse(event, "running other programs")
        elif event == "import" and args[0].split(".")[0] in blocked_modules:
            refuse(event, args[0])
        elif event.startswith("ctypes."):
            refuse(event, "ctypes")

    if hook_on:
        sys.addaudithook(hook)
    return code, SandboxRefused

_code, _Refused = _sandbox_setup()
del _sandbox_setup
sys.argv = ["main.py"]
_g = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}

def _leave(status, message):
    try:
        sys.stdout.flush()
        sys.stderr.write(message)
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(status)

try:
    exec(_code, _g)
except MemoryError:
    _g = None
    _leave(101, "MemoryError: the sandbox's memory limit was reached\n")
except _Refused as e:
    _leave(102, "%s: %s\n" % (type(e).__name__, e))
except OSError as e:
    if e.errno == 27:
        _leave(103, "OSError: the sandbox's file size limit was reached (%s)\n" % (e,))
    raise
'''


@dataclass
class SandboxResult:
    ok: bool
    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    killed_reason: str | None  # timeout | cpu | memory | file_size | refused | signal:NAME | None
    wall_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    refused: list[str] = field(default_factory=list)  # one line per refused operation (first 50 per process)
    isolation: dict = field(default_factory=dict)
    workdir: str = ""


@dataclass
class SandboxStats:
    """Counts over many runs (e.g. one training step's tool calls or code rewards); `as_dict` for metrics."""

    runs: int = 0
    ok: int = 0
    timeouts: int = 0
    cpu_kills: int = 0
    memory_kills: int = 0
    file_size_kills: int = 0
    crashes: int = 0  # non-zero exit (an exception) or a signal other than the limits above
    refused_runs: int = 0  # runs in which at least one operation was refused
    refused_ops: int = 0
    truncated: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, r: SandboxResult) -> None:
        with self._lock:
            self.runs += 1
            self.ok += r.ok
            self.timeouts += r.killed_reason == "timeout"
            self.cpu_kills += r.killed_reason == "cpu"
            self.memory_kills += r.killed_reason == "memory"
            self.file_size_kills += r.killed_reason == "file_size"
            self.crashes += (not r.ok and r.killed_reason not in ("timeout", "cpu", "memory", "file_size",
                                                                 "refused"))
            self.refused_runs += bool(r.refused) or r.killed_reason == "refused"
            self.refused_ops += len(r.refused)
            self.truncated += r.stdout_truncated or r.stderr_truncated

    def as_dict(self, prefix: str = "sandbox/") -> dict[str, int]:
        names = ("runs", "ok", "timeouts", "cpu_kills", "memory_kills", "file_size_kills", "crashes",
                 "refused_runs", "refused_ops", "truncated")
        return {prefix + n: getattr(self, n) for n in names}


# ---- the child's pre-exec step (kernel layers). Everything it calls is resolved here, in the parent.

class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_libc_cache: list = []


def _libc():
    if not _libc_cache:
        try:
            _libc_cache.append(ctypes.CDLL(None, use_errno=True))
        except OSError:
            _libc_cache.append(None)
    return _libc_cache[0]


def _drop_to(uid: int, libc) -> None:
    """setuid to `uid` keeping CAP_DAC_READ_SEARCH only (effective, permitted, inheritable, ambient), so the
    interpreter can be read wherever it is installed; no_new_privs so no setuid binary gives privileges back."""
    if libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_KEEPCAPS)")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    bit = 1 << _CAP_DAC_READ_SEARCH
    data[0].effective = data[0].permitted = data[0].inheritable = bit
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    if libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE, _CAP_DAC_READ_SEARCH, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAP_AMBIENT_RAISE)")
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _make_preexec(limits: list, status_fd: int, uid: int | None, want_netns: bool):
    libc = _libc()
    encode = str.encode

    def preexec():  # runs in the forked child, before exec
        done = []
        if want_netns and libc is not None:
            if libc.unshare(CLONE_NEWNET) == 0:
                done.append("net_namespace")
        if uid is not None and libc is not None:
            try:
                _drop_to(uid, libc)
                done.append("uid_dropped")
            except OSError:
                os._exit(126)  # half-dropped: do not run the user's code with unknown privileges
        os.write(status_fd, encode("iso " + ",".join(done) + "\n"))
        for res, value in limits:  # last: RLIMIT_AS would make the steps above fail in a large parent
            resource.setrlimit(res, value)

    return preexec


# ---- isolation probe: which kernel layers work here (cached per process)

_iso_cache: dict = {}
_iso_lock = threading.Lock()
_uid_counter = itertools.count()
_uid_offset = random.randrange(_UID_SPAN)


def _next_uid() -> int:
    return _UID_BASE + (_uid_offset + os.getpid() * 7919 + next(_uid_counter)) % _UID_SPAN


def isolation_report() -> dict:
    """Which layers `run_python` uses on this machine: {"net_namespace", "uid_dropped", "audit_hook",
    "rlimit_nproc_enforced"}; probed once per process by starting a trivial sandbox with each kernel layer."""
    with _iso_lock:
        if not _iso_cache:
            root = os.geteuid() == 0
            netns = uid = False
            if _libc() is not None:
                r = _run("pass", timeout_s=10, memory_mb=512, cpu_s=10, max_file_mb=1, max_procs=16,
                         stdin=None, max_output_bytes=4096, audit_hook=True, netns=True, uid=None)
                netns = "net_namespace" in r.isolation.get("applied", ())
                if root:
                    try:
                        r = _run("pass", timeout_s=10, memory_mb=512, cpu_s=10, max_file_mb=1, max_procs=16,
                                 stdin=None, max_output_bytes=4096, audit_hook=True, netns=False,
                                 uid=_next_uid())
                        uid = r.ok and "uid_dropped" in r.isolation.get("applied", ())
                    except OSError:
                        uid = False
            _iso_cache.update(net_namespace=netns, uid_dropped=uid, audit_hook=True,
                              rlimit_nproc_enforced=uid or not root)
        return dict(_iso_cache)


# ---- the run

def _drain(stream, cap: int, out: list) -> None:
    """Read `stream` to EOF keeping the first `cap` bytes; out = [bytes, truncated]."""
    kept, truncated = bytearray(), False
    try:
        while True:
            chunk = getattr(stream, "read1", stream.read)(65536)
            if not chunk:
                break
            room = cap - len(kept)
            if room > 0:
                kept += chunk[:room]
            if len(chunk) > max(room, 0):
                truncated = True
    except (OSError, ValueError):
        pass
    out[:] = [bytes(kept), truncated]


def _kill_uid(uid: int) -> int:
    """SIGKILL every live process whose real uid is `uid` (a run's private uid: leftovers that left the group)."""
    killed = 0
    for _ in range(20):
        found = False
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/status") as f:
                    status = f.read()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if fields.get("Uid", "").split()[:1] == [str(uid)] and not fields.get("State", "").strip().startswith("Z"):
                try:
                    os.kill(int(name), signal.SIGKILL)
                    found, killed = True, killed + 1
                except ProcessLookupError:
                    pass
        if not found:
            break
        time.sleep(0.01)
    return killed


def _run(code, *, timeout_s, memory_mb, cpu_s, max_file_mb, max_procs, stdin, max_output_bytes, audit_hook,
         netns, uid) -> SandboxResult:
    root = tempfile.mkdtemp(prefix="hybridrl-sandbox-")
    work = os.path.join(root, "work")
    try:
        os.mkdir(work)
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        stdin_file = None
        if stdin is not None:
            stdin_file = os.path.join(root, "stdin")
            with open(stdin_file, "wb") as f:
                f.write(stdin.encode("utf-8") if isinstance(stdin, str) else stdin)
        if uid is not None:
            os.chmod(root, 0o711)
            os.chown(work, uid, uid)
            os.chown(os.path.join(work, "main.py"), uid, uid)
            if stdin_file:
                os.chmod(stdin_file, 0o644)
        limits = [
            (resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)),
            (resource.RLIMIT_FSIZE, (max_file_mb << 20, max_file_mb << 20)),
            (resource.RLIMIT_NPROC, (max_procs, max_procs)),
            (resource.RLIMIT_NOFILE, (64, 64)),
            (resource.RLIMIT_CORE, (0, 0)),
            (resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20)),
        ]
        status_r, status_w = os.pipe()
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": work, "TMPDIR": work,
               "HYBRIDRL_SANDBOX_FD": str(status_w), "HYBRIDRL_SANDBOX_HOOK": "1" if audit_hook else "0"}
        stdin_handle = open(stdin_file, "rb") if stdin_file else subprocess.DEVNULL
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "-c", _BOOTSTRAP], cwd=work, env=env, stdin=stdin_handle,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                pass_fds=(status_w,), preexec_fn=_make_preexec(limits, status_w, uid, netns))
        finally:
            os.close(status_w)
            if stdin_file:
                stdin_handle.close()
        outs = [[b"", False] for _ in range(3)]
        status_file = os.fdopen(status_r, "rb", buffering=0)
        readers = [threading.Thread(target=_drain, args=(s, c, o), daemon=True)
                   for s, c, o in zip((proc.stdout, proc.stderr, status_file),
                                      (max_output_bytes, max_output_bytes, 1 << 16), outs)]
        for t in readers:
            t.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the leader, or what it forked and left behind
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        if uid is not None:
            _kill_uid(uid)
        for t in readers:
            t.join(timeout=2.0)
        wall = time.monotonic() - start
        for s in (proc.stdout, proc.stderr, status_file):
            s.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    status_lines = outs[2][0].decode("utf-8", "replace").splitlines()
    applied = next((ln[4:].split(",") for ln in status_lines if ln.startswith("iso ")), [])
    applied = [a for a in applied if a]
    refused = [ln[len("refused "):] for ln in status_lines if ln.startswith("refused ")]
    stdout = outs[0][0].decode("utf-8", "replace")
    stderr = outs[1][0].decode("utf-8", "replace")
    rc = proc.returncode
    reason = None
    if timed_out:
        reason = "timeout"
    elif rc == EXIT_MEMORY or (rc != 0 and "MemoryError" in stderr):
        reason = "memory"
    elif rc == EXIT_REFUSED:
        reason = "refused"
    elif rc == EXIT_FILE_SIZE or rc == -signal.SIGXFSZ:
        reason = "file_size"
    elif rc in (-signal.SIGXCPU, -signal.SIGKILL):  # SIGKILL without our timeout: the hard CPU limit
        reason = "cpu"
    elif rc is not None and rc < 0:
        reason = f"signal:{signal.Signals(-rc).name}" if -rc in signal.valid_signals() else f"signal:{-rc}"
    return SandboxResult(ok=rc == 0 and reason is None, stdout=stdout, stderr=stderr,
                         exit_code=rc, timed_out=timed_out, killed_reason=reason, wall_s=wall,
                         stdout_truncated=outs[0][1], stderr_truncated=outs[1][1], refused=refused,
                         isolation={"applied": applied, "audit_hook": audit_hook, "uid": uid}, workdir=work)


def run_python(code: str, *, timeout_s: float = 10.0, memory_mb: int = 512, cpu_s: int | None = None,
               max_file_mb: int = 16, max_procs: int = 16, stdin: str | bytes | None = None,
               max_output_bytes: int = 64 * 1024, audit_hook: bool = True,
               stats: SandboxStats | None = None) -> SandboxResult:
    """Run `code` as __main__ in a fresh sandboxed interpreter (see the module docstring for the layers).

    timeout_s: wall clock, then the process group is SIGKILLed (killed_reason "timeout"); cpu_s: CPU seconds
    (default timeout_s + 1, "cpu"); memory_mb: address space ("memory"); max_file_mb: largest file written
    ("file_size"); max_procs: processes of the run (enforced when the uid is dropped, or the caller is not root);
    max_output_bytes: stdout and stderr are each cut there (stdout_truncated / stderr_truncated).
    audit_hook=False leaves out the in-process guard (only for testing the kernel layers). `stats` counts the run.
    `ok` is True only for exit status 0 within every limit.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_file_mb < 0 or max_procs < 1:
        raise ValueError("run_python: timeout_s, memory_mb and max_procs must be positive, max_file_mb >= 0")
    iso = isolation_report()
    cpu = int(cpu_s) if cpu_s is not None else int(timeout_s) + 1
    result = _run(code, timeout_s=timeout_s, memory_mb=int(memory_mb), cpu_s=max(cpu, 1),
                  max_file_mb=int(max_file_mb), max_procs=int(max_procs), stdin=stdin,
                  max_output_bytes=int(max_output_bytes), audit_hook=audit_hook, netns=iso["net_namespace"],
                  uid=_next_uid() if iso["uid_dropped"] else None)
    result.isolation.update(net_namespace="net_namespace" in result.isolation["applied"],
                            uid_dropped="uid_dropped" in result.isolation["applied"],
                            rlimit_nproc_enforced=iso["rlimit_nproc_enforced"])
    if stats is not None:
        stats.record(result)
    return result
