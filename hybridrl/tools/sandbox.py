"""`run_python`: run untrusted Python (a tool call, a generated solution under test) in a throw-away sandbox process.

The boundary is the kernel's, not the code's: the child runs without capabilities, in its own network and mount
namespaces whose filesystem holds only the interpreter, its standard library and the work directory, under
Landlock and seccomp where the kernel has them (sandbox_layers.py says what each layer does). Layers:

- A fresh interpreter (`python -I -S -B`: no user site, no site-packages, no environment variables honoured, no
  bytecode written) with a minimal environment (nothing inherited: no tokens or keys), stdin from a file or
  /dev/null, cwd = a new temporary directory deleted afterwards.
- Resource limits set just before the interpreter is exec'd: CPU seconds (RLIMIT_CPU, SIGXCPU), address space
  (RLIMIT_AS: MemoryError), file size (RLIMIT_FSIZE), processes (RLIMIT_NPROC) and open files (RLIMIT_NOFILE); a
  wall-clock timeout that SIGKILLs the whole process group, and, with a per-run uid, every process left with that
  uid.
- The kernel layers of sandbox_layers.py: `user_namespace` (not root), `net_namespace`, `mount_namespace`,
  `uid_dropped` (root), `capabilities_dropped`, `no_new_privs`, `landlock`, `seccomp`. A launcher
  (sandbox_launcher.py), a fresh single-threaded interpreter, applies them to itself and then execs the sandboxed
  interpreter in place, so the process the parent started is the sandbox.
- `audit_hook`: a `sys.addaudithook` hook refusing sockets, writes outside the work directory, running programs
  and `ctypes` with a clear PermissionError and a count (`SandboxResult.refused`). It is the friendly first
  refusal, not the wall: code that disarms it meets the layers above.

Which layers this machine allows is probed once per process, by trivial runs through the same launcher
(`isolation_report`, logged at the first run: on, and off with the reason); every result says which were applied
(`SandboxResult.isolation["applied"]`) and `SandboxStats` counts them. `require=` (or
HYBRIDRL_SANDBOX_REQUIRED_LAYERS, set by the trainer from `reward_model.sandbox.required_layers`) makes a run
refuse to start without the named layers (SandboxUnavailableError). A values channel (`values=True`) gives the
program a pipe, `__sandbox_values_fd__`, whose bytes come back in `SandboxResult.values`: what a caller compares in
its own process (rewards/code_tests.py).

Choices:
- The layers that fail in the probe are left out and reported rather than failing every run: a laptop without
  user namespaces still runs tool calls; a training run that must not do so says `required_layers: all`.
- A launcher process, not preexec_fn: the parent (a trainer: Ray, torch and the sandbox's reader threads) is
  multi-threaded, and Python code run between fork and exec can wait forever on a lock another thread held at
  the fork. Popen starts the launcher without running any Python in the forked child; the launcher gets its plan
  as data on argv, and the exec replaces both argv and environment. It costs one interpreter start per run.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from hybridrl.tools.sandbox_bootstrap import BOOTSTRAP, EXIT_FILE_SIZE, EXIT_MEMORY, EXIT_REFUSED
from hybridrl.tools.sandbox_launcher import _SYS, _libc, landlock_abi
from hybridrl.tools.sandbox_layers import KERNEL_LAYERS, ChildPlan, python_view, seccomp_filter

__all__ = ["REQUIRED_LAYERS_ENV", "SandboxResult", "SandboxStats", "SandboxUnavailableError", "isolation_report",
           "parse_required_layers", "run_python"]

log = logging.getLogger(__name__)
REQUIRED_LAYERS_ENV = "HYBRIDRL_SANDBOX_REQUIRED_LAYERS"
# what `all` asks for: every layer that does not depend on who runs it (uid_dropped needs root, user_namespace
# is what a normal user needs instead)
ALL_LAYERS = ("net_namespace", "mount_namespace", "capabilities_dropped", "no_new_privs", "landlock", "seccomp")
_UID_BASE = 1_500_000_000  # well above any real account; one uid per run
_UID_SPAN = 100_000_000
_VALUES_CAP = 1 << 20


class SandboxUnavailableError(RuntimeError):
    """A run was required to have layers this machine cannot apply; the message names them, why, and the key."""


@dataclass
class SandboxResult:
    ok: bool
    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    killed_reason: str | None  # timeout | cpu | memory | file_size | refused | layer_failed | signal:NAME | None
    wall_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    refused: list[str] = field(default_factory=list)  # one line per refused operation (first 50 per process)
    isolation: dict = field(default_factory=dict)  # applied: [layers], uid, failed: why a layer failed, {layer: on}
    workdir: str = ""
    values: bytes = b""  # what the program wrote to its values channel (run_python(values=True))


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
    layers: dict = field(default_factory=dict)  # {layer: runs it was applied to}, exported as sandbox/layer/NAME
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
            for layer in KERNEL_LAYERS:
                self.layers[layer] = self.layers.get(layer, 0) + (layer in r.isolation.get("applied", ()))

    def as_dict(self, prefix: str = "sandbox/") -> dict[str, int]:
        names = ("runs", "ok", "timeouts", "cpu_kills", "memory_kills", "file_size_kills", "crashes",
                 "refused_runs", "refused_ops", "truncated")
        out = {prefix + n: getattr(self, n) for n in names}
        out.update({f"{prefix}layer/{k}": v for k, v in self.layers.items()})
        return out


# ---- which layers work here (probed once per process)

_iso_cache: dict = {}
_iso_lock = threading.Lock()
_uid_counter = itertools.count()
_uid_offset = random.randrange(_UID_SPAN)


def _next_uid() -> int:
    return _UID_BASE + (_uid_offset + os.getpid() * 7919 + next(_uid_counter)) % _UID_SPAN


def _candidates() -> tuple[list[str], dict[str, str]]:
    """The layers worth probing here, and why the others are off."""
    off: dict[str, str] = {}
    if _libc() is None:
        return [], {x: "libc cannot be loaded through ctypes" for x in KERNEL_LAYERS}
    layers = list(KERNEL_LAYERS)
    layers.remove("user_namespace" if os.geteuid() == 0 else "uid_dropped")
    off["user_namespace" if os.geteuid() == 0 else "uid_dropped"] = (
        "not needed as root" if os.geteuid() == 0 else "needs root (a fresh uid per run)")
    if "pivot_root" not in _SYS:
        off["mount_namespace"] = off["landlock"] = f"no syscall numbers known for {os.uname().machine}"
    elif landlock_abi() == 0:
        off["landlock"] = "the kernel has no Landlock (or it is disabled)"
    if seccomp_filter() is None:
        off["seccomp"] = f"no seccomp filter for {os.uname().machine}"
    return [x for x in layers if x not in off], off


# who to leave out first when a probe run fails without naming the layer (the interpreter would not start)
_SUSPECTS = ("landlock", "seccomp", "uid_dropped", "capabilities_dropped", "mount_namespace", "user_namespace",
             "net_namespace", "no_new_privs")


def _probe(layers: frozenset) -> tuple[bool, str]:
    try:
        r = _run("pass", timeout_s=20, memory_mb=512, cpu_s=20, max_file_mb=1, max_procs=16, stdin=None,
                 max_output_bytes=4096, audit_hook=True, layers=layers, values=False)
    except OSError as e:  # exec refused: the interpreter is out of reach with these layers
        return False, f"starting the interpreter failed: {e}"
    return r.ok, r.isolation.get("failed") or f"exit {r.exit_code}: {r.stderr[-300:]!r}"


def isolation_report() -> dict:
    """{layer: on} for every kernel layer, "audit_hook", "rlimit_nproc_enforced" and "off" ({layer: why}); probed
    once per process by starting trivial sandboxes, dropping a layer each time one fails, then logged."""
    with _iso_lock:
        if not _iso_cache:
            layers, off = _candidates()
            for _ in range(len(KERNEL_LAYERS) + 1):
                ok, failed = _probe(frozenset(layers))
                if ok or not layers:
                    break
                named = failed.split(":")[0]
                culprit = named if named in layers else next(x for x in _SUSPECTS if x in layers)
                off[culprit] = failed if named == culprit else f"the probe run failed with it ({failed})"
                layers.remove(culprit)
            on = set(layers) if ok else set()
            off.update({x: "the probe run failed" for x in layers if x not in on})
            _iso_cache.update({x: x in on for x in KERNEL_LAYERS}, audit_hook=True, off=dict(off),
                              rlimit_nproc_enforced="uid_dropped" in on or os.geteuid() != 0)
            level = logging.INFO if all(x in on for x in ALL_LAYERS) else logging.WARNING
            log.log(level, "sandbox layers on: %s; off: %s", ", ".join(x for x in KERNEL_LAYERS if x in on) or "none",
                    "; ".join(f"{k} ({v})" for k, v in off.items()) or "none")
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in _iso_cache.items()}


def parse_required_layers(value, key: str) -> tuple[str, ...]:
    """The layers a config value asks for: null or [] (none), "all" (ALL_LAYERS) or a list of layer names."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = ALL_LAYERS if value == "all" else [v for v in value.split(",") if v]
    names = tuple(value)
    unknown = [n for n in names if n not in KERNEL_LAYERS]
    if unknown:
        raise ValueError(f"{key}={list(names)!r}: unknown sandbox layer(s) {unknown}; known: {list(KERNEL_LAYERS)} "
                         f"or 'all' ({list(ALL_LAYERS)})")
    return names


def check_required_layers(required, key: str = REQUIRED_LAYERS_ENV) -> None:
    """Raise SandboxUnavailableError when a layer in `required` cannot be applied on this machine."""
    if not required:
        return
    iso = isolation_report()
    missing = [x for x in required if not iso[x]]
    if missing:
        raise SandboxUnavailableError(
            f"{key} requires sandbox layer(s) {missing}, which this machine cannot apply: "
            + "; ".join(f"{x}: {iso['off'].get(x, 'off')}" for x in missing)
            + ". Run where they are available (root, or user namespaces and Landlock enabled), or drop them from "
            + key)


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



def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """True if the process ended within timeout_s. A pidfd wakes the wait at the exit itself, where
    Popen.wait(timeout) sleeps in growing steps (up to 50 ms) and notices a 30 ms run ~10 ms late."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):   # no pidfd (kernel < 5.3, not Linux)
        try:
            proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        ended = bool(poller.poll(max(0.0, timeout_s) * 1000))
    finally:
        os.close(fd)
    if ended:
        proc.wait()
    return ended


def _run(code, *, timeout_s, memory_mb, cpu_s, max_file_mb, max_procs, stdin, max_output_bytes, audit_hook,
         layers: frozenset, values: bool, values_cap: int = _VALUES_CAP) -> SandboxResult:
    root = tempfile.mkdtemp(prefix="hybridrl-sandbox-")
    work = os.path.join(root, "work")
    uid = _next_uid() if "uid_dropped" in layers else None
    try:
        os.mkdir(work)
        os.mkdir(os.path.join(root, "jail"))
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
        limits = [
            (resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)),
            (resource.RLIMIT_FSIZE, (max_file_mb << 20, max_file_mb << 20)),
            (resource.RLIMIT_NPROC, (max_procs, max_procs)),
            (resource.RLIMIT_NOFILE, (64, 64)),
            (resource.RLIMIT_CORE, (0, 0)),
            (resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20)),
        ]
        status_r, status_w = os.pipe()
        values_r, values_w = os.pipe() if values else (-1, -1)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": work, "TMPDIR": work,
               "HYBRIDRL_SANDBOX_FD": str(status_w), "HYBRIDRL_SANDBOX_HOOK": "1" if audit_hook else "0",
               "HYBRIDRL_SANDBOX_VALUES_FD": str(values_w)}
        program = seccomp_filter() if "seccomp" in layers else None
        if program:
            env["HYBRIDRL_SANDBOX_SECCOMP"] = program.hex()
        view = python_view(work) if layers & {"mount_namespace", "landlock"} else []
        plan = ChildPlan(layers=layers, argv=[os.path.realpath(sys.executable), "-I", "-S", "-B", "-c", BOOTSTRAP],
                         env=env, view=view, jail=os.path.join(root, "jail"), uid=uid, limits=limits,
                         status_fd=status_w)
        stdin_handle = open(stdin_file, "rb") if stdin_file else subprocess.DEVNULL
        start = time.monotonic()
        try:  # the launcher applies the layers and execs the interpreter in place: proc.pid is the sandbox
            proc = subprocess.Popen(
                plan.command(), cwd=work, env={}, stdin=stdin_handle, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                pass_fds=tuple(fd for fd in (status_w, values_w) if fd >= 0))
        finally:
            for fd in (status_w, values_w):
                if fd >= 0:
                    os.close(fd)
            if stdin_file:
                stdin_handle.close()
        streams = [proc.stdout, proc.stderr, os.fdopen(status_r, "rb", buffering=0)]
        caps = [max_output_bytes, max_output_bytes, 1 << 16]
        if values:
            streams.append(os.fdopen(values_r, "rb", buffering=0))
            caps.append(values_cap)
        outs = [[b"", False] for _ in streams]
        readers = [threading.Thread(target=_drain, args=(s, c, o), daemon=True)
                   for s, c, o in zip(streams, caps, outs)]
        for t in readers:
            t.start()
        timed_out = not _wait(proc, timeout_s)
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
        for s in streams:
            s.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return _result(proc.returncode, outs, timed_out, wall, audit_hook, uid, work)


def _result(rc, outs, timed_out, wall, audit_hook, uid, work) -> SandboxResult:
    status_lines = outs[2][0].decode("utf-8", "replace").splitlines()
    applied = next((ln[4:].split(",") for ln in status_lines if ln.startswith("iso ")), [])
    applied = [a for a in applied if a] + [ln[5:] for ln in status_lines if ln.startswith("iso+ ")]
    failed = next((ln[len("layer-failed "):] for ln in status_lines if ln.startswith("layer-failed ")), None)
    refused = [ln[len("refused "):] for ln in status_lines if ln.startswith("refused ")]
    stdout = outs[0][0].decode("utf-8", "replace")
    stderr = outs[1][0].decode("utf-8", "replace")
    reason = None
    if timed_out:
        reason = "timeout"
    elif failed:
        reason = "layer_failed"
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
                         isolation={"applied": applied, "audit_hook": audit_hook, "uid": uid, "failed": failed},
                         workdir=work, values=outs[3][0] if len(outs) > 3 else b"")


def run_python(code: str, *, timeout_s: float = 10.0, memory_mb: int = 512, cpu_s: int | None = None,
               max_file_mb: int = 16, max_procs: int = 16, stdin: str | bytes | None = None,
               max_output_bytes: int = 64 * 1024, audit_hook: bool = True, values: bool = False,
               max_values_bytes: int = _VALUES_CAP, require=None, layers=None,
               stats: SandboxStats | None = None) -> SandboxResult:
    """Run `code` as __main__ in a fresh sandboxed interpreter (see the module docstring for the layers).

    timeout_s: wall clock, then the process group is SIGKILLed (killed_reason "timeout"); cpu_s: CPU seconds
    (default timeout_s + 1, "cpu"); memory_mb: address space ("memory"); max_file_mb: largest file written
    ("file_size"); max_procs: processes of the run (enforced when the uid is dropped, or the caller is not root);
    max_output_bytes: stdout and stderr are each cut there (stdout_truncated / stderr_truncated).
    audit_hook=False leaves out the in-process guard and `layers` (names) applies only those of the working kernel
    layers: both only for testing one layer alone. values=True opens the values channel (SandboxResult.values,
    cut at max_values_bytes, default 1 MiB). require: layer names (or "all") the run must have, default
    HYBRIDRL_SANDBOX_REQUIRED_LAYERS; SandboxUnavailableError when one is off here. `stats` counts the run.
    `ok` is True only for exit status 0 within every limit.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_file_mb < 0 or max_procs < 1:
        raise ValueError("run_python: timeout_s, memory_mb and max_procs must be positive, max_file_mb >= 0")
    if require is None:
        require = parse_required_layers(os.environ.get(REQUIRED_LAYERS_ENV) or None, REQUIRED_LAYERS_ENV)
    else:
        require = parse_required_layers(require, "run_python(require=...)")
    check_required_layers(require)
    iso = isolation_report()
    cpu = int(cpu_s) if cpu_s is not None else int(timeout_s) + 1
    result = _run(code, timeout_s=timeout_s, memory_mb=int(memory_mb), cpu_s=max(cpu, 1),
                  max_file_mb=int(max_file_mb), max_procs=int(max_procs), stdin=stdin,
                  max_output_bytes=int(max_output_bytes), audit_hook=audit_hook, values=values,
                  values_cap=int(max_values_bytes),
                  layers=frozenset(x for x in KERNEL_LAYERS if iso[x] and (layers is None or x in layers)))
    result.isolation.update({x: x in result.isolation["applied"] for x in KERNEL_LAYERS},
                            rlimit_nproc_enforced=iso["rlimit_nproc_enforced"])
    if stats is not None:
        stats.record(result)
    return result
