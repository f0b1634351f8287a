"""The process that runs untrusted code for the `code` reward (standard library only, Python >= 3.8).

Started by `sandbox.py` as `PYTHON -I -S -c <this source> MODE`, MODE = "ns" inside a namespace
sandbox (bubblewrap or unshare: network, mount, PID, IPC, UTS and user namespaces, read-only root,
private /tmp) or "bare" when the run allowed unsandboxed code (resource limits only; see below).

Protocol: the parent writes one JSON payload on stdin and closes it: {"code", "tests", "limits"}, where
each test is the parent's *rewritten* test (`sealed.py`): every `assert` became a call
`__grpo_probe__(ID, lambda: e1, ...)` that hands back the values of the sub-expressions the parent
cannot compute itself. The expected values of the asserts never come here, and this process never
decides whether a test passed: it sends JSON lines on its stdout ("ready", "solution", one "probe"
line per assert executed, "test" when a test snippet finished, "done"), and the parent evaluates every
assert against the values. Code that takes this process over (frame inspection, patched builtins,
sys.exit, writing to the channel) can therefore only report values, which is what a solution
returning those values would do: it cannot report a pass.

Before the untrusted code runs: stdin reads /dev/null, stdout/stderr go to /dev/null (the channel is
a private descriptor), and the rlimits are set (CPU seconds, address space, file size, open files,
no core dumps, processes). In "bare" mode, as root, the process also leaves root for `nobody`
(keeping only CAP_DAC_READ_SEARCH when the interpreter's files are not readable by others), becomes
the child subreaper and kills every descendant at the end; in "ns" mode the namespace does all that.
"""

import json
import os
import resource
import signal
import sys
import time

NOBODY_ID = 65534
PROBE_NAME = "__grpo_probe__"
MAX_DEPTH = 64
# Linux capability numbers and prctl options (include/uapi/linux/capability.h, prctl.h).
CAP_DAC_READ_SEARCH, CAP_SETGID, CAP_SETUID = 2, 6, 7
PR_SET_KEEPCAPS, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 8, 36, 38
LINUX_CAPABILITY_VERSION_3 = 0x20080522


def encode(value, depth=0, _type=type):
    """A JSON-safe, tagged copy of plain data; anything else (or too deep) is {"o": type name}."""
    kind = _type(value)
    if depth > MAX_DEPTH:
        return {"o": "nested too deep"}
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind is tuple:
        return {"t": [encode(v, depth + 1) for v in value]}
    if kind is set or kind is frozenset:
        return {"s" if kind is set else "fs": [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is complex:
        return {"c": [value.real, value.imag]}
    return {"o": kind.__name__}


def _threads_of_uid(uid):
    """Processes + threads the user runs (RLIMIT_NPROC counts them all for that user)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/status" % entry) as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1").strip())
    return total


def _others_can_read(directory):
    """Whether a user with no special rights can list `directory` and reach it from /."""
    path = os.path.realpath(directory)
    if not os.stat(path).st_mode & 0o004:
        return False
    while True:
        if not os.stat(path).st_mode & 0o001:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def _capset(caps):
    """Set effective = permitted = `caps` (capability numbers < 32); True on success."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    mask = sum(1 << c for c in caps)
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)(mask, mask, 0, 0, 0, 0)  # two {effective, permitted, inheritable}
    return libc.capset(header, data) == 0 and libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) == 0


def _drop_root():
    """Bare mode as root: become `nobody`; 'nobody', 'nobody+read' (kept CAP_DAC_READ_SEARCH) or 'root'."""
    needed = {os.path.dirname(os.__file__), os.path.dirname(json.__file__)}
    needed.update(p for p in sys.path if p and os.path.isdir(p))
    keep_read = not all(_others_can_read(p) for p in needed)
    if keep_read:
        try:
            if not _capset((CAP_DAC_READ_SEARCH, CAP_SETGID, CAP_SETUID)):
                return "root"
        except OSError:
            return "root"
    os.setgroups([])
    os.setgid(NOBODY_ID)
    os.setuid(NOBODY_ID)
    if keep_read and not _capset((CAP_DAC_READ_SEARCH,)):
        raise OSError("could not lower capabilities after leaving root")
    return "nobody+read" if keep_read else "nobody"


def _prctl_bare():
    """No new privileges, and child subreaper (orphans of the code become ours to kill and reap)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _kill_descendants(*, kill=os.kill, waitpid=os.waitpid, listdir=os.listdir, read=open, sleep=time.sleep):
    """Bare mode: SIGKILL every other process of our group and every child of ours, and reap them."""
    me, group = os.getpid(), os.getpgrp()
    for _ in range(200):
        victims = []
        for entry in listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                with read("/proc/%s/stat" % entry) as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z" and (int(fields[2]) == group or int(fields[1]) == me):
                victims.append(int(entry))
        for pid in victims:
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                continue
        while True:
            try:
                pid, _ = waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if not victims:
            return
        sleep(0.002)


def _limit(kind, value):
    """Set soft and hard limit to `value` (or to the current hard limit when that is lower)."""
    _, hard = resource.getrlimit(kind)
    value = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
    resource.setrlimit(kind, (value, value))


def _confine(limits, mode):
    """Apply the rlimits (and in bare mode leave root); returns the user the code runs as."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(usage.ru_utime + usage.ru_stime + limits["cpu_s"]) + 1
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_FSIZE, limits["max_file_bytes"])
    _limit(resource.RLIMIT_NOFILE, limits["max_open_files"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    who = "uid %d" % os.getuid()
    if mode == "bare":
        _prctl_bare()
        if os.geteuid() == 0:
            who = _drop_root()
    # in a fresh user namespace only this sandbox's processes count; in bare mode, all of the user's
    base = 0 if who.startswith("nobody") else _threads_of_uid(os.getuid())
    _limit(resource.RLIMIT_NPROC, base + limits["max_procs"])
    _limit(resource.RLIMIT_AS, limits["memory_bytes"])  # last: ctypes above needs address space
    return who


def main(*, _exec=exec, _compile=compile, _write=os.write, _dumps=json.dumps, _exit=os._exit):
    """Entry point; the functions it uses are bound before the code runs, so patching builtins,
    `os` or `json` from inside the code changes neither how tests run nor how lines are written."""
    mode = sys.argv[1]
    payload = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    out_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)

    def send(message):
        try:
            line = _dumps(message, separators=(",", ":"))
        except (ValueError, TypeError, RecursionError):  # e.g. an int too long to print
            line = _dumps({"k": message.get("k"), "a": message.get("a"), "v": None})
        _write(out_fd, (line + "\n").encode("utf-8", "surrogatepass"))

    def probe(assert_id, *thunks):
        values = []
        for thunk in thunks:
            try:
                values.append(encode(thunk()))
            except BaseException as exc:  # the sub-expression raised: the parent decides what that means
                values.append({"r": type(exc).__name__})
        send({"k": "probe", "a": assert_id, "v": values})

    if mode == "bare":
        os.chdir(payload["workdir"])
        os.environ["HOME"] = payload["workdir"]
    send({"k": "ready", "user": _confine(payload["limits"], mode)})
    namespace = {"__name__": "solution", "__builtins__": __builtins__, PROBE_NAME: probe}
    try:
        _exec(_compile(payload["code"], "solution.py", "exec"), namespace)
        send({"k": "solution", "ok": True})
    except BaseException as exc:  # any failure of untrusted code, SystemExit included
        send({"k": "solution", "ok": False, "error": type(exc).__name__})
        namespace = None
    for index, test in enumerate(payload["tests"]):
        if namespace is None or test is None:
            continue
        try:
            _exec(_compile(test, "test_%d.py" % index, "exec"), namespace)
            send({"k": "test", "i": index, "ok": True})
        except BaseException as exc:  # an exception or sys.exit inside the test
            send({"k": "test", "i": index, "ok": False, "error": type(exc).__name__})
    send({"k": "done"})
    if mode == "bare":
        _kill_descendants()
    _exit(0)


if __name__ == "__main__":
    main()
