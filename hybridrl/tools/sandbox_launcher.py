"""The sandbox's launcher: a fresh, single-threaded interpreter that applies the kernel layers to itself and then
execs the sandboxed interpreter. sandbox_layers.py says what each layer does and in which order.

sandbox.py starts it as `python -I -S -B <this file> PLAN` (no preexec_fn: nothing of Python runs between fork and
exec in the parent, whose other threads may hold locks), with an empty environment, the status pipe and the values
channel passed as descriptors and cwd = the work directory. PLAN is the hex of a marshal'd dict (`ChildPlan.command`):
layers, view binds, jail, uid, rlimits, status fd, and the argv and environment to exec. The launcher:

1. applies the layers in order (`apply_layers`); a step that fails writes "layer-failed <step>: <error>" to the
   status fd and exits 126: a run whose layers differ from what was asked is never started half-isolated;
2. writes "iso <layers applied>" to the status fd;
3. sets the rlimits, last (RLIMIT_AS could make the steps above fail);
4. puts SIGPIPE and SIGXFSZ back to their defaults (the interpreter ignores them, and exec keeps ignored signals)
   and execs the plan's argv with exactly the plan's environment. An exec that fails (the interpreter out of reach
   with these layers) is reported as "layer-failed exec: <error>", exit 126.

Choices:
- It is run as a script by path and imports only the standard library: `-I -S` keep the script's directory,
  site-packages and the environment out, so it works the same whether hybridrl is installed or run from a
  checkout. Only light modules (ctypes, marshal), as its start is paid on every run: dataclasses, json or
  platform would each add more than its own code does.
- The plan goes on argv, which the exec replaces, and never into an environment the sandboxed code could read.
"""

import _signal  # `signal` would import enum; the launcher only resets two handlers
import ctypes
import marshal
import os
import resource
import struct
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP, CLONE_NEWTIME = (0x10000000, 0x20000000, 0x40000000,
                                                                           0x02000000, 0x00000080)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
MNT_DETACH = 2
O_PATH = getattr(os, "O_PATH", 0o10000000)
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SYS = {"x86_64": {"pivot_root": 155, "landlock_create_ruleset": 444, "landlock_add_rule": 445,
                   "landlock_restrict_self": 446}}.get(os.uname().machine, {})

# Landlock access rights by ABI version (linux/landlock.h)
_LL_EXECUTE, _LL_WRITE_FILE, _LL_READ_FILE, _LL_READ_DIR = 1, 2, 4, 8
_LL_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_LL_TRUNCATE, _LL_IOCTL_DEV = 1 << 14, 1 << 15
_LL_FILE_RIGHTS = _LL_EXECUTE | _LL_WRITE_FILE | _LL_READ_FILE | _LL_TRUNCATE | _LL_IOCTL_DEV


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


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0 when it has none or it is disabled)."""
    libc = _libc()
    if libc is None or "landlock_create_ruleset" not in _SYS:
        return 0
    version = libc.syscall(_SYS["landlock_create_ruleset"], None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(version), 0)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise OSError(ctypes.get_errno(), what)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _build_root(libc, plan: dict, work: str) -> None:
    """Mount the view on a fresh tmpfs at plan["jail"] and make it the root (sandbox_layers.py, step 3)."""
    jail = plan["jail"]
    # top-level library links (/lib -> usr/lib on merged-/usr systems), read before the root changes
    links = [(d, os.readlink(d)) for d in ("/lib", "/lib64", "/lib32") if os.path.islink(d)]
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    _check(libc.mount(b"tmpfs", jail.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=0755"), "mount tmpfs")
    for path, kind, src_flags in plan["view"]:
        target = jail + path
        is_dir = kind == "hide" or os.path.isdir(path)
        os.makedirs(target if is_dir else os.path.dirname(target), exist_ok=True)
        if not is_dir:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
        if kind == "hide":
            _check(libc.mount(b"tmpfs", target.encode(), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=4k"),
                   f"mount tmpfs over {path}")
            continue
        _check(libc.mount(path.encode(), target.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
        flags = MS_REMOUNT | MS_BIND | MS_NOSUID | src_flags
        flags |= {"ro": MS_RDONLY | MS_NODEV, "dev": MS_RDONLY, "rw": MS_NODEV}[kind]
        _check(libc.mount(None, target.encode(), None, flags, None), f"remount {path}")
    for link, dest in links:
        if not os.path.lexists(jail + link):
            os.symlink(dest, jail + link)
    _check(libc.mount(None, jail.encode(), None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None),
           "remount the root read-only")
    os.chdir(jail)
    _check(libc.syscall(_SYS["pivot_root"], b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir(work)


def _landlock(libc, plan: dict, fds: dict, abi: int) -> None:
    fs = _LL_FS_BY_ABI.get(abi, _LL_FS_BY_ABI[5])
    attr = struct.pack("=QQQ", fs, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)[:8 if abi < 4 else 16 if abi < 6 else 24]
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(_SYS["landlock_create_ruleset"], buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for path, kind, _ in plan["view"]:
            if kind == "hide":
                continue
            allowed = {"ro": _LL_EXECUTE | _LL_READ_FILE | _LL_READ_DIR, "rw": fs,
                       "dev": _LL_READ_FILE | _LL_WRITE_FILE | _LL_TRUNCATE | _LL_IOCTL_DEV}[kind] & fs
            if not os.path.isdir(path):
                allowed &= _LL_FILE_RIGHTS
            rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fds[path]), 12)
            _check(libc.syscall(_SYS["landlock_add_rule"], ruleset, 1, rule, ctypes.c_uint32(0)),
                   f"landlock_add_rule {path}")
        _check(libc.syscall(_SYS["landlock_restrict_self"], ruleset, ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _drop_capabilities(libc, uid: int | None, last_cap: int) -> None:
    for cap in range(last_cap + 1):
        _check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"PR_CAPBSET_DROP {cap}")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    header, data = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), data), "capset")
    _check(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "PR_CAP_AMBIENT_CLEAR_ALL")


class LayerFailed(Exception):
    def __init__(self, step: str, error: OSError):
        super().__init__(f"{step}: {error}")


def apply_layers(plan: dict) -> list[str]:
    """Apply plan["layers"] to this process in the order of sandbox_layers.py; the layers applied, or LayerFailed
    naming the step."""
    libc, layers, uid = _libc(), set(plan["layers"]), plan["uid"]
    work = next((path for path, kind, _ in plan["view"] if kind == "rw"), "")
    done: list[str] = []
    step, fds = "start", {}
    try:
        if libc is None:
            raise OSError("libc cannot be loaded through ctypes")
        flags = ((CLONE_NEWUSER if "user_namespace" in layers else 0)
                 | (CLONE_NEWNET if "net_namespace" in layers else 0)
                 | (CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS if "mount_namespace" in layers else 0))
        last_cap, euid, egid = 0, os.geteuid(), os.getegid()
        if "capabilities_dropped" in layers or uid is not None:  # read now: /proc is not in the view built below
            step = "capabilities_dropped"
            with open("/proc/sys/kernel/cap_last_cap") as f:
                last_cap = int(f.read())
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
            _build_root(libc, plan, work)
            done.append("mount_namespace")
        if "landlock" in layers:  # opened in the final mount layout: rules made earlier do not match there
            step = "landlock"
            abi = landlock_abi()
            fds = {p: os.open(p, O_PATH | os.O_CLOEXEC) for p, kind, _ in plan["view"] if kind != "hide"}
        if "capabilities_dropped" in layers or uid is not None:
            step = "capabilities_dropped"
            _drop_capabilities(libc, uid, last_cap)
            done += ["uid_dropped"] if uid is not None else []
            done += ["capabilities_dropped"]
        step = "no_new_privs"
        _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
        done.append("no_new_privs")
        if "landlock" in layers:
            step = "landlock"
            _landlock(libc, plan, fds, abi)
            done.append("landlock")
    except OSError as e:
        raise LayerFailed(step, e) from e
    finally:
        for fd in fds.values():
            os.close(fd)
    return done


def main(arg: str) -> None:
    plan = marshal.loads(bytes.fromhex(arg))
    status = plan["status_fd"]
    try:
        done = apply_layers(plan)
    except LayerFailed as e:
        os.write(status, f"layer-failed {e}\n".encode())
        os._exit(126)  # never run the user's code with fewer layers than asked
    os.write(status, ("iso " + ",".join(done) + "\n").encode())
    for res, soft, hard in plan["limits"]:
        resource.setrlimit(res, (soft, hard))
    for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):
        _signal.signal(sig, _signal.SIG_DFL)
    try:
        os.execve(plan["argv"][0], plan["argv"], plan["env"])
    except OSError as e:
        os.write(status, f"layer-failed exec: {e}\n".encode())
        os._exit(126)


if __name__ == "__main__":
    main(sys.argv[1])
