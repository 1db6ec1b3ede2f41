"""The kernel layers of the sandbox, applied in the forked child before it execs the interpreter.

What the child does, in order (each step is a layer named in `SandboxResult.isolation["applied"]`):

1. `user_namespace` (only when not root): `unshare(CLONE_NEWUSER)` with the caller's uid and gid mapped to
   themselves, which is what lets an unprivileged user create the namespaces below.
2. `net_namespace`: `unshare(CLONE_NEWNET)`, an empty network namespace (a down loopback, no abstract Unix sockets
   of the host). IPC and UTS namespaces come with the mount namespace.
3. `mount_namespace`: a private mount namespace whose root is a fresh read-only tmpfs holding only the view:
   the interpreter binary, its standard library (site-packages hidden under an empty tmpfs), the system library
   directories, `/etc/ld.so.cache`, `/dev/{null,zero,random,urandom}` (read-only binds) and the work directory
   (read-write), each at its own path; `pivot_root` into it and the old root detached. Nothing else of the host
   (/root, /home, /etc, /tmp, /proc, the repository) exists for the child.
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
  and before the uid drop (the parent's paths may be out of the fresh uid's reach).
- A step that fails in the child ends it with status 126 before the user's code runs: a run whose layers differ
  from what was asked is never started half-isolated. Which layers work is probed once per process
  (sandbox.isolation_report), so a machine without one simply runs without it, and says so.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import struct
import sys
import sysconfig
from dataclasses import dataclass, field

__all__ = ["KERNEL_LAYERS", "ChildPlan", "landlock_abi", "make_preexec", "python_view", "seccomp_filter"]

KERNEL_LAYERS = ("user_namespace", "net_namespace", "mount_namespace", "uid_dropped", "capabilities_dropped",
                 "no_new_privs", "landlock", "seccomp")

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP, CLONE_NEWTIME = (0x10000000, 0x20000000, 0x40000000,
                                                                           0x02000000, 0x00000080)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
_ST_TO_MS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: 1024, 2048: 2048, 4096: 1 << 21}
MNT_DETACH = 2
O_PATH = getattr(os, "O_PATH", 0o10000000)
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SYS = {"x86_64": {"pivot_root": 155, "landlock_create_ruleset": 444, "landlock_add_rule": 445,
                   "landlock_restrict_self": 446}}.get(platform.machine(), {})

# Landlock access rights by ABI version (linux/landlock.h)
_LL_EXECUTE, _LL_WRITE_FILE, _LL_READ_FILE, _LL_READ_DIR = 1, 2, 4, 8
_LL_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_LL_TRUNCATE, _LL_IOCTL_DEV = 1 << 14, 1 << 15
_LL_FILE_RIGHTS = _LL_EXECUTE | _LL_WRITE_FILE | _LL_READ_FILE | _LL_TRUNCATE | _LL_IOCTL_DEV


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


def _symlinks() -> list[tuple[str, str]]:
    """Top-level library links (/lib -> usr/lib on merged-/usr systems), recreated in the view."""
    return [(d, os.readlink(d)) for d in ("/lib", "/lib64", "/lib32") if os.path.islink(d)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0 when it has none or it is disabled)."""
    libc = _libc()
    if libc is None or "landlock_create_ruleset" not in _SYS:
        return 0
    version = libc.syscall(_SYS["landlock_create_ruleset"], None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(version), 0)


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


# ---- the child's pre-exec step. Everything it calls is resolved in the parent.

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


@dataclass
class ChildPlan:
    """What one child applies: the layers wanted (a subset of KERNEL_LAYERS), its view and its limits."""
    layers: frozenset
    view: list = field(default_factory=list)
    jail: str = ""  # an empty directory that becomes the child's root
    uid: int | None = None
    limits: list = field(default_factory=list)
    status_fd: int = -1


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise OSError(ctypes.get_errno(), what)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _build_root(libc, plan: ChildPlan, links: list, work: str) -> None:
    """Mount the view on a fresh tmpfs at plan.jail and make it the root (see the module docstring, step 3)."""
    jail = plan.jail
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    _check(libc.mount(b"tmpfs", jail.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=0755"), "mount tmpfs")
    for b in plan.view:
        target = jail + b.path
        is_dir = b.kind == "hide" or os.path.isdir(b.path)
        os.makedirs(target if is_dir else os.path.dirname(target), exist_ok=True)
        if not is_dir:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
        if b.kind == "hide":
            _check(libc.mount(b"tmpfs", target.encode(), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=4k"),
                   f"mount tmpfs over {b.path}")
            continue
        _check(libc.mount(b.path.encode(), target.encode(), None, MS_BIND | MS_REC, None), f"bind {b.path}")
        flags = MS_REMOUNT | MS_BIND | MS_NOSUID | b.flags
        flags |= {"ro": MS_RDONLY | MS_NODEV, "dev": MS_RDONLY, "rw": MS_NODEV}[b.kind]
        _check(libc.mount(None, target.encode(), None, flags, None), f"remount {b.path}")
    for link, dest in links:
        if not os.path.lexists(jail + link):
            os.symlink(dest, jail + link)
    _check(libc.mount(None, jail.encode(), None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None),
           "remount the root read-only")
    os.chdir(jail)
    _check(libc.syscall(_SYS["pivot_root"], b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir(work)


def _landlock(libc, plan: ChildPlan, fds: dict, abi: int) -> None:
    fs = _LL_FS_BY_ABI.get(abi, _LL_FS_BY_ABI[5])
    attr = struct.pack("=QQQ", fs, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)[:8 if abi < 4 else 16 if abi < 6 else 24]
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(_SYS["landlock_create_ruleset"], buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for b in plan.view:
            if b.kind == "hide":
                continue
            is_dir = os.path.isdir(b.path)
            allowed = {"ro": _LL_EXECUTE | _LL_READ_FILE | _LL_READ_DIR, "rw": fs,
                       "dev": _LL_READ_FILE | _LL_WRITE_FILE | _LL_TRUNCATE | _LL_IOCTL_DEV}[b.kind] & fs
            if not is_dir:
                allowed &= _LL_FILE_RIGHTS
            rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fds[b.path]), 12)
            _check(libc.syscall(_SYS["landlock_add_rule"], ruleset, 1, rule, ctypes.c_uint32(0)),
                   f"landlock_add_rule {b.path}")
        _check(libc.syscall(_SYS["landlock_restrict_self"], ruleset, ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _drop_capabilities(libc, plan: ChildPlan, last_cap: int) -> None:
    for cap in range(last_cap + 1):
        _check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"PR_CAPBSET_DROP {cap}")
    if plan.uid is not None:
        os.setgroups([])
        os.setresgid(plan.uid, plan.uid, plan.uid)
        os.setresuid(plan.uid, plan.uid, plan.uid)
    header, data = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), data), "capset")
    _check(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "PR_CAP_AMBIENT_CLEAR_ALL")


def make_preexec(plan: ChildPlan):
    """The function Popen runs in the child before exec: applies plan.layers in the order of the module docstring,
    writes "iso <layers>" to plan.status_fd, then sets the rlimits; any failure exits 126."""
    libc = _libc()
    links = _symlinks()
    abi = landlock_abi() if "landlock" in plan.layers else 0
    last_cap = int(open("/proc/sys/kernel/cap_last_cap").read()) if "capabilities_dropped" in plan.layers else 0
    euid, egid = os.geteuid(), os.getegid()
    work = next((b.path for b in plan.view if b.kind == "rw"), "")
    layers = plan.layers

    def preexec():
        done = []
        step = "start"
        try:
            fds = {}
            flags = ((CLONE_NEWUSER if "user_namespace" in layers else 0)
                     | (CLONE_NEWNET if "net_namespace" in layers else 0)
                     | (CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS if "mount_namespace" in layers else 0))
            step = "unshare"
            if flags:
                _check(libc.unshare(flags), "unshare")
            if "user_namespace" in layers:
                step = "user_namespace"
                _write("/proc/self/setgroups", "deny")
                _write("/proc/self/uid_map", f"{euid} {euid} 1")
                _write("/proc/self/gid_map", f"{egid} {egid} 1")
            done += [x for x in ("user_namespace", "net_namespace") if x in layers]
            if "mount_namespace" in layers:
                step = "mount_namespace"
                _build_root(libc, plan, links, work)
                done.append("mount_namespace")
            if "landlock" in layers:  # opened in the final mount layout: rules made earlier do not match there
                fds = {b.path: os.open(b.path, O_PATH | os.O_CLOEXEC) for b in plan.view if b.kind != "hide"}
            if "capabilities_dropped" in layers or plan.uid is not None:
                step = "capabilities_dropped"
                _drop_capabilities(libc, plan, last_cap)
                done += ["uid_dropped"] if plan.uid is not None else []
                done += ["capabilities_dropped"]
            step = "no_new_privs"
            _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
            done.append("no_new_privs")
            if "landlock" in layers:
                step = "landlock"
                _landlock(libc, plan, fds, abi)
                done.append("landlock")
            for fd in fds.values():
                os.close(fd)
        except OSError as e:
            os.write(plan.status_fd, f"layer-failed {step}: {e}\n".encode())
            os._exit(126)  # never run the user's code with fewer layers than asked
        os.write(plan.status_fd, ("iso " + ",".join(done) + "\n").encode())
        for res, value in plan.limits:  # last: RLIMIT_AS would make the steps above fail in a large parent
            resource.setrlimit(res, value)

    return preexec
