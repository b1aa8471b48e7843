"""A warm Python for the tests' subprocesses: torch already imported, forked per process.

Most of the suite's CPU outside pytest was the same 2.3 s of ``import torch`` + ``torch._dynamo`` in each
``[sys.executable, ...]`` a test starts. Here one server per xdist worker imports them once. A test's
``subprocess.Popen([sys.executable, ...])`` (or ``.venv/bin/<console script>``) instead starts a tiny client
(``python -I -S`` of this file, ~20 ms) that hands its stdin/stdout/stderr, argv, environment and cwd to the
server, which forks a child to run the program as ``python`` would. The client stays the test's process: it
forwards the signals it gets and exits with the child's status (a child killed by signal N kills the client
with N); if the client dies, the server SIGKILLs the child; if the server is gone, the client execs the real
interpreter. The child's own Python subprocesses (``neuron-explorer inspect -- python train.py``, a bench's
workloads) go to the same server.

What differs: the program's pid is not ``proc.pid``, and torch is already imported. A test that needs the
program's pid (``proc.pid``, psutil, ``/proc``) or checks what it imports is marked ``real_python`` (or sets
``NEURON_TEST_WARM=0`` in the child's environment). Real interpreters also run any command with an interpreter
option other than ``-u``/``-m``/``-c``, and any environment that differs from the server's in a variable read
while torch imports or the interpreter starts (``TORCH*``, ``OMP_*``, ``LD_*``, ``PYTHON*`` but ``PYTHONPATH``
and ``PYTHONUNBUFFERED``, the locale).

Usage (tests/conftest.py): ``with serve(directory): ...`` patches ``subprocess.Popen`` for the worker's session.
"""
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys

OPT_OUT = "NEURON_TEST_WARM"
enabled = True   # off during a test marked real_python (tests/conftest.py)
# read while torch (and numpy, MKL/OpenMP) import, or by the interpreter at start: a child whose value differs
# from the server's must be a real interpreter
_SENSITIVE = ("TORCH", "PYTORCH", "OMP_", "MKL", "KMP_", "GOMP", "OPENBLAS", "LD_", "PYTHON", "LC_", "LANG",
              "CUDA", "TRITON", "NUMPY")
_HANDLED = {"PYTHONPATH", "PYTHONUNBUFFERED", "TORCH_DEVICE_BACKEND_AUTOLOAD", "PYTHONDONTWRITEBYTECODE"}
# Popen arguments that set up the process itself (limits in preexec_fn, extra descriptors, ids): a fork of the
# server would not get them
_PER_PROCESS = ("shell", "executable", "preexec_fn", "pass_fds", "user", "group", "extra_groups", "process_group")
_SET_BY_IMPORT = {}   # what importing torch put in the server's os.environ: a child's import would have too
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _key(env):
    return {k: v for k, v in env.items()
            if k.startswith(_SENSITIVE) and k not in _HANDLED and _SET_BY_IMPORT.get(k) != v}


def _strings(args):
    if not isinstance(args, (list, tuple)):
        return None
    try:
        argv = [os.fspath(a) for a in args]
    except TypeError:
        return None
    return argv if all(isinstance(a, str) for a in argv) else None


def _shebang(argv):
    """A console script of this venv (``.venv/bin/neuron-cc``) is ``python script``, as the kernel runs it."""
    if argv and argv[0] != sys.executable and os.path.dirname(argv[0]) == os.path.dirname(sys.executable):
        try:
            with open(argv[0], "rb") as f:
                first = f.readline(512).rstrip()
            interpreter = os.fsdecode(first[2:])
            if first.startswith(b"#!") and os.path.realpath(interpreter) == os.path.realpath(sys.executable):
                return [sys.executable, *argv]
        except OSError:
            pass
    return argv


def _plan(argv):
    """``(unbuffered, kind, target, args)`` for ``python argv...``, or None when it needs a real interpreter."""
    unbuffered, i = False, 0
    while i < len(argv) and argv[i] == "-u":
        unbuffered, i = True, i + 1
    if i >= len(argv):
        return None
    if argv[i] in ("-m", "-c"):
        return (unbuffered, argv[i], argv[i + 1], argv[i + 2:]) if i + 1 < len(argv) else None
    if argv[i].startswith("-"):
        return None
    return unbuffered, "script", argv[i], argv[i + 1:]


# --- in the pytest worker --------------------------------------------------------------------------------

@contextlib.contextmanager
def serve(directory):
    """Start this worker's server and route ``subprocess.Popen([sys.executable, ...])`` to it until exit."""
    path = os.path.join(directory, "warm.sock")
    server = subprocess.Popen([sys.executable, __file__, "server", path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, start_new_session=True)
    if server.stdout.readline() != b"ready\n":   # the server could not start: every process is a real one
        server.kill()
        server.wait()
        yield
        return
    real = _route(path, _key(os.environ))
    try:
        yield
    finally:
        subprocess.Popen = real
        server.stdin.close()
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _route(path, key):
    """Patch ``subprocess.Popen`` to send ``[sys.executable, ...]`` to the server at ``path``; returns the real one."""
    real = subprocess.Popen

    class Popen(real):
        def __init__(self, args, *more, **kwargs):
            env = kwargs.get("env")
            env = os.environ if env is None else env
            argv = _shebang(_strings(args))
            if (enabled and not more and argv and argv[0] == sys.executable and _plan(argv[1:]) is not None
                    and not any(kwargs.get(k) for k in _PER_PROCESS) and kwargs.get("close_fds", True)
                    and kwargs.get("umask", -1) == -1 and env.get(OPT_OUT) != "0" and _key(env) == key):
                args = [sys.executable, "-I", "-S", __file__, "client", path, *argv[1:]]
            super().__init__(args, *more, **kwargs)

    subprocess.Popen = Popen
    return real


# --- the client: the process the test holds ---------------------------------------------------------------

def _client(path, argv):
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(path)
    except OSError:   # the server is gone: this process becomes the real interpreter, same pid
        os.execv(sys.executable, [sys.executable, *argv])
    body = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(sock, [struct.pack("!I", len(body)) + body], [0, 1, 2])
    reader = sock.makefile("r")
    pid = int(reader.readline())
    for sig in _FORWARDED:
        signal.signal(sig, lambda n, _f: os.kill(pid, n))
    kind, _, value = reader.readline().partition(" ")   # "exit N" or "signal N"; "" if the server died
    if kind == "signal":
        sig = int(value)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(int(value) if kind == "exit" else 1)


# --- the server: one per xdist worker -------------------------------------------------------------------

def _recv(conn):
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    if len(data) < 4 or len(fds) != 3:   # a client killed while connecting
        for fd in fds:
            os.close(fd)
        raise EOFError
    (size,) = struct.unpack("!I", data[:4])
    body = data[4:]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise EOFError
        body += chunk
    return json.loads(body), fds


def _server(path):
    """Serve until stdin closes (the worker is gone); in a forked child, return its request."""
    import selectors

    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "reap")
    sel.register(0, selectors.EVENT_READ, "parent")
    children = {}    # pid -> the client's connection
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            what = key.data
            if what == "parent":
                for pid in children:
                    os.kill(pid, signal.SIGKILL)
                sys.exit(0)
            if what == "reap":
                os.read(wake_r, 4096)
                while children:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    conn = children.pop(pid, None)
                    if conn is None:
                        continue
                    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
                    msg = f"signal {sig}\n" if sig else f"exit {os.WEXITSTATUS(status)}\n"
                    if conn in sel.get_map():   # a killed client's connection is already unregistered
                        sel.unregister(conn)
                    try:
                        conn.sendall(msg.encode())
                    except OSError:
                        pass
                    conn.close()
            elif what == "accept":
                conn, _ = listener.accept()
                try:
                    request, fds = _recv(conn)
                except (OSError, EOFError, ValueError):
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    for fd in (wake_r, wake_w):
                        os.close(fd)
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    listener.close()
                    for other in children.values():
                        other.close()
                    conn.close()
                    return request, fds
                for fd in fds:
                    os.close(fd)
                conn.sendall(f"{pid}\n".encode())
                children[pid] = conn
                sel.register(conn, selectors.EVENT_READ, pid)
            else:   # a client closed its end early: it was killed, so its child goes too
                try:
                    os.kill(what, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                sel.unregister(key.fileobj)


def _become(request, fds):
    """In the forked child: take the client's streams, environment and cwd, as a fresh interpreter would."""
    import io
    import tempfile

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    env = request["env"]
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(_SET_BY_IMPORT)
    os.environ.update(env)
    plan = _plan(request["argv"])
    unbuffered = plan[0] or bool(env.get("PYTHONUNBUFFERED"))
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))

    def stream(fd, mode, like):   # as the interpreter opens them: the server's encoding (the same locale)
        raw = io.FileIO(fd, mode, closefd=False)
        if mode == "rb":
            return io.TextIOWrapper(io.BufferedReader(raw), encoding=like.encoding, errors=like.errors)
        buf = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(buf, encoding=like.encoding, errors=like.errors,
                                line_buffering=raw.isatty() or fd == 2, write_through=unbuffered)

    sys.stdin = sys.__stdin__ = stream(0, "rb", sys.__stdin__)
    sys.stdout = sys.__stdout__ = stream(1, "wb", sys.__stdout__)
    sys.stderr = sys.__stderr__ = stream(2, "wb", sys.__stderr__)
    tempfile.tempdir = None
    base = [p for p in sys.path[1:] if p not in _INHERITED_PATH]
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    _, kind, target, args = plan
    first = os.getcwd() if kind == "-m" else "" if kind == "-c" else os.path.dirname(os.path.realpath(target))
    sys.path[:] = [first, *extra, *base]
    if env.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1":
        import torch
        torch._import_device_backends()
    _route(*_SERVER)   # its own Python subprocesses fork from the server too
    return kind, target, args


def _run(kind, target, args):
    """Run the program in a fresh ``__main__``, as the interpreter does; its exit is the interpreter's own."""
    import runpy
    import types

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    if kind == "-m":
        sys.argv = ["-m", *args]
        runpy._run_module_as_main(target, alter_argv=True)
        return
    if kind == "-c":
        sys.argv = ["-c", *args]
        source, filename = target, "<string>"
    else:
        sys.argv = [target, *args]
        with open(target, "rb") as f:
            source = f.read()
        filename = main.__file__ = target
        main.__cached__ = None
    exec(compile(source, filename, "exec"), main.__dict__)


def _exit(kind, target, args):
    """Exit as the interpreter would (threads joined, atexit run, streams flushed) but without tearing down
    torch's modules: that alone costs a fork most of a second of copy-on-write faults."""
    import atexit
    import threading
    import traceback

    code = 0
    try:
        _run(kind, target, args)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code < 0:   # killed by Ctrl-C, as Python >= 3.8 exits on an uncaught KeyboardInterrupt
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


_INHERITED_PATH = set()
_SERVER = ()   # the server's socket and environment key, for the children's own subprocesses

if __name__ == "__main__":
    if sys.argv[1] == "client":   # before anything else is imported: the client must start in milliseconds
        _client(sys.argv[2], sys.argv[3:])
    before = dict(os.environ)
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"   # the neuron device registers per child (it reads env)
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.export  # noqa: F401

    assert not any(m.startswith(("neuron_stack", "traces")) for m in sys.modules), "the server must not import ours"
    _INHERITED_PATH.update(p for p in before.get("PYTHONPATH", "").split(os.pathsep) if p)
    del os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"]
    _SET_BY_IMPORT.update((k, v) for k, v in os.environ.items() if k not in before)   # TORCHINDUCTOR_CACHE_DIR
    _SERVER = (sys.argv[2], _key(before))
    _exit(*_become(*_server(sys.argv[2])))
