"""The kernel layers of the sandbox, and what the parent prepares for them: the view, the seccomp filter and the
plan (`ChildPlan`) for the launcher (sandbox_launcher.py), the single-threaded process that applies the layers to
itself and then execs the interpreter.

What the launcher does, in order (each step is a layer named in `SandboxResult.isolation["applied"]`):

1. `user_namespace` (only when not root): `unshare(CLONE_NEWUSER)` with the caller's uid and gid mapped to
   themselves, which is what lets an unprivileged user create the namespaces below.
2. `net_namespace`: `unshare(CLONE_NEWNET)`, an empty network namespace (a down loopback, no abstract Unix sockets
   of the host). IPC and UTS namespaces come with the mount namespace.
3. `mount_namespace`: a private mount namespace whose root is a fresh read-only tmpfs holding only the view:
   the interpreter binary, its standard library (site-packages hidden under an empty tmpfs), the system library
   directories, `/etc/ld.so.cache`, `/dev/{null,zero,random,urandom}` (read-only binds) and the work directory
   (read-write), each at its own path; `pivot_root` into it and the old root detached. Nothing else of the host
   (/root, /home, /etc, /tmp, /proc, the repository) exists for the sandboxed process.
4. `uid_dropped` (only as root): a fresh unprivileged uid and gid, no supplementary groups.
5. `capabilities_dropped`: the bounding set emptied, then effective, permitted and inheritable cleared (capset)
   and the ambient set cleared.
6. `no_new_privs`: PR_SET_NO_NEW_PRIVS, so no setuid or file-capability binary gives anything back.
7. `landlock` (when the kernel has it): a ruleset granting read and execute on the view, read-write on the work
   directory and the /dev nodes, nothing elsewhere; no TCP bind or connect (ABI 4); no signals to, or abstract
   sockets of, processes outside the sandbox (ABI 6). It holds even where the mount namespace could not be made.
8. `seccomp` (x86_64): installed by the bootstrap once the interpreter runs, before the user's code, from the
   filter built here: execve/execveat, ptrace, mount and namespace calls, clone with namespace flags, module and
   keyring calls, io_uring, bpf, perf_event_open and the like fail with EPERM; sockets other than AF_UNIX too.

Choices:
- ctypes to libc and raw syscalls, no package: every call is one line, and libseccomp or a Landlock binding would
  be a native dependency for a few structs.
- Every bind shows its source at the source's own path, so one list (`python_view`) is both the mount view and
  the Landlock rules, and error messages inside and outside name the same paths. Landlock's descriptors are
  opened once the final mount layout is in place (rules made from the host's mounts do not match the binds),
  and before the uid drop (the view's paths may be out of the fresh uid's reach).
- A step that fails in the launcher ends it with status 126 before the user's code runs: a run whose layers differ
  from what was asked is never started half-isolated. Which layers work is probed once per process
  (sandbox.isolation_report), so a machine without one simply runs without it, and says so.
"""

from __future__ import annotations

import marshal
import os
import platform
import struct
import sys
import sysconfig
from dataclasses import dataclass, field

from hybridrl.tools import sandbox_launcher
from hybridrl.tools.sandbox_launcher import (  # shared with the launcher, which must stay light to start
    CLONE_NEWCGROUP,
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWTIME,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
)

__all__ = ["KERNEL_LAYERS", "ChildPlan", "python_view", "seccomp_filter"]

KERNEL_LAYERS = ("user_namespace", "net_namespace", "mount_namespace", "uid_dropped", "capabilities_dropped",
                 "no_new_privs", "landlock", "seccomp")

_ST_TO_MS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: 1024, 2048: 2048, 4096: 1 << 21}


@dataclass(frozen=True)
class Bind:
    path: str  # the same path on the host and in the view
    kind: str  # "ro" (read, execute) | "rw" (the work directory) | "dev" (a device node, read-write) | "hide"
    flags: int = 0  # mount flags the source carries (kept on the read-only remount; a user namespace must)


def python_view(work: str) -> list[Bind]:
    """What the interpreter needs to run, plus the work directory: the binds of the mount namespace and the
    paths Landlock allows."""
    binds: list[Bind] = []
    seen: set[str] = set()

    def add(path: str, kind: str) -> None:
        real = os.path.realpath(path)
        if real in seen or not os.path.exists(real):
            return
        seen.add(real)
        flags = 0 if kind == "hide" else sum(ms for st, ms in _ST_TO_MS.items() if os.statvfs(real).f_flag & st)
        binds.append(Bind(real, kind, flags))

    add(sys.executable, "ro")
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib"):
        add(paths[key], "ro")
    add(os.path.join(paths["platstdlib"], "lib-dynload"), "ro")
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        add(sysconfig.get_config_var("LIBDIR") or "", "ro")
    for d in ("/lib", "/lib64", "/lib32", "/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/local/lib"):
        add(d, "ro")
    add("/etc/ld.so.cache", "ro")
    for dev in ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"):
        add(dev, "dev")
    add(work, "rw")
    shown = [b.path for b in binds if b.kind == "ro" and os.path.isdir(b.path)]
    for key in ("purelib", "platlib"):  # installed packages: not part of a stdlib-only sandbox
        p = os.path.realpath(paths[key])
        if any(p.startswith(d + os.sep) for d in shown) and p not in seen:
            seen.add(p)
            binds.append(Bind(p, "hide"))
    return binds


# ---- seccomp: a classic BPF program, built in the parent, installed by the bootstrap
_BPF_LD_ABS, _BPF_JEQ, _BPF_JGE, _BPF_JSET, _BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL = 0x7FFF0000, 0x80000000
_RET_EPERM, _RET_ENOSYS = 0x00050000 | 1, 0x00050000 | 38
_AUDIT_ARCH_X86_64 = 0xC000003E
_X86_64_DENIED = {  # each fails with EPERM
    "execve": 59, "execveat": 322, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248,
    "request_key": 249, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "open_by_handle_at": 304, "name_to_handle_at": 303, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "pidfd_getfd": 438, "fanotify_init": 300, "acct": 163,
    "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171, "iopl": 172,
    "ioperm": 173, "quotactl": 179, "syslog": 103, "settimeofday": 164, "clock_settime": 227, "adjtimex": 159,
    "clock_adjtime": 305, "uselib": 134, "vhangup": 153, "lookup_dcookie": 212,
}
_X86_64_CLONE, _X86_64_CLONE3, _X86_64_SOCKET = 56, 435, 41
_NS_FLAGS = (CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
             | CLONE_NEWCGROUP | CLONE_NEWTIME)
_AF_UNIX = 1


def seccomp_filter() -> bytes | None:
    """The filter program (struct sock_filter[]) for this machine, or None where no syscall table is known here."""
    if platform.machine() != "x86_64":
        return None
    ins = [(_BPF_LD_ABS, 0, 0, 4), (_BPF_JEQ, 1, 0, _AUDIT_ARCH_X86_64), (_BPF_RET, 0, 0, _RET_KILL),
           (_BPF_LD_ABS, 0, 0, 0), (_BPF_JGE, 0, 1, 0x40000000), (_BPF_RET, 0, 0, _RET_EPERM)]  # x32 calls
    for nr in sorted(_X86_64_DENIED.values()):
        ins += [(_BPF_JEQ, 0, 1, nr), (_BPF_RET, 0, 0, _RET_EPERM)]
    # clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc fall back to clone
    ins += [(_BPF_JEQ, 0, 1, _X86_64_CLONE3), (_BPF_RET, 0, 0, _RET_ENOSYS)]
    ins += [(_BPF_JEQ, 0, 4, _X86_64_CLONE), (_BPF_LD_ABS, 0, 0, 16), (_BPF_JSET, 0, 1, _NS_FLAGS),
            (_BPF_RET, 0, 0, _RET_EPERM), (_BPF_RET, 0, 0, _RET_ALLOW)]
    ins += [(_BPF_JEQ, 0, 4, _X86_64_SOCKET), (_BPF_LD_ABS, 0, 0, 16), (_BPF_JEQ, 1, 0, _AF_UNIX),
            (_BPF_RET, 0, 0, _RET_EPERM), (_BPF_RET, 0, 0, _RET_ALLOW)]
    ins.append((_BPF_RET, 0, 0, _RET_ALLOW))
    return b"".join(struct.pack("=HBBI", *i) for i in ins)


# ---- the plan the launcher gets

@dataclass
class ChildPlan:
    """What one launcher applies: the layers wanted (a subset of KERNEL_LAYERS), its view and its limits, then
    what it execs (argv, with exactly env as the environment)."""
    layers: frozenset
    argv: list
    env: dict
    view: list = field(default_factory=list)
    jail: str = ""  # an empty directory that becomes the child's root
    uid: int | None = None
    limits: list = field(default_factory=list)  # [(resource, (soft, hard))]
    status_fd: int = -1

    def command(self) -> list[str]:
        """The launcher's command line: a fresh interpreter that ignores the environment and site-packages and
        runs sandbox_launcher.py by path, the plan on argv (plain data: marshal'd builtins, hex)."""
        plan = {"layers": sorted(self.layers), "view": [(b.path, b.kind, b.flags) for b in self.view],
                "jail": self.jail, "uid": self.uid, "limits": [(r, s, h) for r, (s, h) in self.limits],
                "status_fd": self.status_fd, "argv": list(self.argv), "env": dict(self.env)}
        return [os.path.realpath(sys.executable), "-I", "-S", "-B", os.path.realpath(sandbox_launcher.__file__),
                marshal.dumps(plan).hex()]
