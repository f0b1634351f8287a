"""Child-process side of the code sandbox (standard library only; run as `python -I THIS WORKDIR`).

Protocol with `sandbox.py`: the parent writes `WORKDIR/payload.json` ({"code", "tests", "limits"})
and sends a random nonce on stdin. This script reads both, opens `WORKDIR/results` for appending,
then — before any untrusted code runs — closes stdin (-> /dev/null), sends stdout/stderr to
/dev/null, applies the rlimits (CPU seconds, address space, file size, open files, no core
dumps, process count), drops root to `nobody` when it runs as root (so RLIMIT_NPROC is enforced
and the repository is not writable; see `_drop_root`), and moves into `WORKDIR/work`. It then
executes the code (module name "solution", so `if __name__ == "__main__"` blocks do not run) and each test in the
same namespace, appending "NONCE solution ok|error" and "NONCE test I pass|fail" lines as it goes,
so a run killed midway still reports the tests that finished. Finally it kills and reaps every
process the code started (it is their subreaper); the parent also kills the process group.

The nonce keeps completions from faking results by printing or writing "pass" lines; it does not
stop code that deliberately inspects this interpreter's frames — the sandbox protects the run
(time, memory, processes, files), and the reward is only as trustworthy as the tests.
"""

import json
import os
import resource
import signal
import sys
import time

NOBODY_ID = 65534
# Linux capability numbers and prctl options (include/uapi/linux/capability.h, prctl.h).
CAP_DAC_READ_SEARCH, CAP_SETGID, CAP_SETUID = 2, 6, 7
PR_SET_KEEPCAPS, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 8, 36, 38
LINUX_CAPABILITY_VERSION_3 = 0x20080522


def _threads_of_uid(uid):
    """Processes + threads the user already runs (RLIMIT_NPROC counts them all for that user)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
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
    """Become `nobody`. Returns the isolation achieved: 'nobody', 'nobody+read' or 'root'.

    When the interpreter's files are not readable by others (e.g. Python installed under /root),
    only CAP_DAC_READ_SEARCH is kept so that imports still work; if that cannot be arranged the
    process stays root (RLIMIT_NPROC is then not enforced) and says so.
    """
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


def _prctl_flags():
    """No new privileges (a set-uid program the code runs gains no rights) and child subreaper
    (orphans of the code's processes become our children, so `_kill_descendants` can reap them)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _kill_descendants(kill=os.kill, waitpid=os.waitpid, listdir=os.listdir, read=open, sleep=time.sleep):
    """SIGKILL every other process of our group and every child of ours, and reap them all.

    Bound at definition time to the original functions, so code that patched `os` cannot stop it.
    Zombies are reaped here instead of waiting for init (which may reap slowly and, until then,
    they count against RLIMIT_NPROC for the next sandbox).
    """
    me, group = os.getpid(), os.getpgrp()
    for _ in range(200):
        victims = []
        for entry in listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                with read(f"/proc/{entry}/stat") as fh:
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


def _confine(limits, work):
    """Apply the rlimits, leave root, enter `work`; returns the isolation mode."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used_cpu = usage.ru_utime + usage.ru_stime
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_FSIZE, limits["max_file_bytes"])
    _limit(resource.RLIMIT_NOFILE, limits["max_open_files"])
    cpu = int(used_cpu + limits["cpu_s"]) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    _prctl_flags()
    isolation = _drop_root() if os.geteuid() == 0 else "user"
    base = 0 if isolation.startswith("nobody") else _threads_of_uid(os.getuid())
    _limit(resource.RLIMIT_NPROC, base + limits["max_procs"])
    _limit(resource.RLIMIT_AS, limits["memory_bytes"])  # last: ctypes above needs some address space
    os.chdir(work)
    os.environ["HOME"] = work
    return isolation


def main(_exec=exec, _compile=compile, _write=os.write):
    """Entry point; `_exec`/`_compile`/`_write` are bound before the code runs, so patching
    builtins or `os` from inside the code cannot change how tests run or how results are written."""
    root = sys.argv[1]
    nonce = sys.stdin.readline().strip()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    with open(os.path.join(root, "payload.json")) as fh:
        payload = json.load(fh)
    os.remove(os.path.join(root, "payload.json"))
    out_fd = os.open(os.path.join(root, "results"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def report(text):
        _write(out_fd, f"{nonce} {text}\n".encode())

    report(f"isolation {_confine(payload['limits'], os.path.join(root, 'work'))}")
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        _exec(_compile(payload["code"], "solution.py", "exec"), namespace)
        report("solution ok")
    except BaseException as exc:  # any failure of untrusted code, SystemExit included
        report(f"solution error {type(exc).__name__}")
        namespace = None
    for index, test in enumerate(payload["tests"]):
        if namespace is None:
            report(f"test {index} fail")
            continue
        try:
            _exec(_compile(test, f"test_{index}.py", "exec"), namespace)
            report(f"test {index} pass")
        except BaseException:  # a failing assert, an exception, or sys.exit inside the test
            report(f"test {index} fail")
    report("done")
    _kill_descendants()
    os._exit(0)


if __name__ == "__main__":
    main()
