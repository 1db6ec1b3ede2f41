"""The program the sandboxed interpreter runs first (`python -I -S -B -c BOOTSTRAP`), before the user's code.

It reads and deletes main.py, installs the seccomp filter passed by the parent (HYBRIDRL_SANDBOX_SECCOMP, hex;
reported as "iso+ seccomp" on the status pipe), installs the audit hook, then runs the code as __main__ and maps
MemoryError, a refusal and EFBIG to exit statuses 101, 102 and 103. The status pipe's descriptor and the values
channel's (`__sandbox_values_fd__` in the program's globals, -1 without one) come from the environment, which is
emptied of them before the user's code runs.

Choices:
- The audit hook is a friendly early refusal with a message and a count, not the boundary: code that reaches the
  hook's closure (gc.get_objects) can switch it off, and then meets the kernel layers (sandbox_layers.py).
- seccomp is installed here and not before exec because the filter forbids execve, which the interpreter's own
  start needs; nothing of the user's runs before it.
"""

__all__ = ["BOOTSTRAP", "EXIT_FILE_SIZE", "EXIT_MEMORY", "EXIT_REFUSED"]

EXIT_MEMORY = 101
EXIT_REFUSED = 102
EXIT_FILE_SIZE = 103

BOOTSTRAP = r'''
import os, sys
def _sandbox_setup():
    fd = int(os.environ.pop("HYBRIDRL_SANDBOX_FD", "-1"))
    hook_on = os.environ.pop("HYBRIDRL_SANDBOX_HOOK", "1") == "1"
    values_fd = int(os.environ.pop("HYBRIDRL_SANDBOX_VALUES_FD", "-1"))
    program = bytes.fromhex(os.environ.pop("HYBRIDRL_SANDBOX_SECCOMP", ""))
    if program:
        _install_seccomp(program, fd)
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
    return code, SandboxRefused, values_fd

def _install_seccomp(program, fd):
    import ctypes
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    buf = ctypes.create_string_buffer(program, len(program))
    prog = Prog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if ctypes.CDLL(None, use_errno=True).prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        os.write(fd, b"layer-failed seccomp: errno %d\n" % ctypes.get_errno())
        os._exit(126)
    os.write(fd, b"iso+ seccomp\n")
    for name in [m for m in sys.modules if m.split(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]  # the user's `import ctypes` then meets the hook like any other

_code, _Refused, _values_fd = _sandbox_setup()
del _sandbox_setup, _install_seccomp
sys.argv = ["main.py"]
_g = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__,
      "__sandbox_values_fd__": _values_fd}

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
