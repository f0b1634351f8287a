"""Hostile inputs for the code sandbox, shared by the root tests and the unprivileged-user driver.

Each case runs one completion's code through `run_tests` with a given mechanism (bwrap | unshare) and
checks both what the parent judged and what is left outside afterwards. `run_case(name, mechanism)`
returns (ok, detail). Run as a script (`python sandbox_cases.py MECHANISM`), it runs every case and
prints one JSON object {name: [ok, detail]}: that is how the tests run them as an unprivileged user.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

from grpo_pilot.engine.rewards.sandbox import SandboxLimits, run_tests

LIMITS = SandboxLimits(timeout_s=8.0, cpu_s=4.0, max_procs=16)
ADD_TEST = ("assert add(2, 3) == 5",)
WRONG_ADD = "def add(a, b):\n    return a - b\n"
Check = Callable[[str], tuple[bool, str]]


def _judged(code: str, tests: tuple[str, ...], expected: tuple[bool, ...], mechanism: str) -> tuple[bool, str]:
    result = run_tests(code, tests, LIMITS, isolation=mechanism)  # type: ignore[arg-type]
    return result.passed == expected, f"passed={result.passed} status={result.status} isolation={result.isolation}"


def correct_solution_passes(mechanism: str) -> tuple[bool, str]:
    return _judged("def add(a, b):\n    return a + b\n", ADD_TEST, (True,), mechanism)


def network_connect_fails(mechanism: str) -> tuple[bool, str]:
    """Outside hosts and a server listening on the host's loopback are both unreachable."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = (
        "import socket\nreached = []\n"
        f"for host, port in (('1.1.1.1', 53), ('8.8.8.8', 443), ('127.0.0.1', {port})):\n"
        "    try:\n        socket.create_connection((host, port), timeout=2).close()\n"
        "        reached.append(host)\n    except OSError:\n        pass\n"
    )
    try:
        return _judged(code, ("assert reached == []", "assert len(reached) > 0"), (True, False), mechanism)
    finally:
        server.close()


def nothing_persists_outside(mechanism: str) -> tuple[bool, str]:
    """Files written to /tmp, /dev/shm, /var/tmp, $HOME and the working directory stay in the job."""
    name = f"grpo-sandbox-{uuid.uuid4().hex}"
    targets = [f"/tmp/{name}", f"/dev/shm/{name}", f"/var/tmp/{name}", f"{Path.home()}/{name}", name]
    code = (
        "import os\nwritten = []\n"
        f"for path in {targets!r} + [os.path.expanduser('~/{name}.home')]:\n"
        "    try:\n        open(path, 'w').write('x')\n        written.append(path)\n    except OSError:\n"
        "        pass\nback = open('/tmp/" + name + "').read()\n"
    )
    ok, detail = _judged(code, ("assert back == 'x'",), (True,), mechanism)  # /tmp is writable inside
    left = [t for t in targets if Path(t).exists()] + [p for p in Path("/tmp").glob(f"{name}*")]
    return ok and not left, f"{detail}; left outside: {left}"


def no_process_survives(mechanism: str) -> tuple[bool, str]:
    """A setsid double fork that sleeps on is gone when the job ends."""
    marker = f"grpo-survivor-{uuid.uuid4().hex}"
    code = (
        "import os, sys\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'])\n"
        "    os._exit(0)\n"
        "import time\ntime.sleep(0.5)\n"
    )
    ok, detail = _judged(code, ("assert 1 + 1 == 2",), (True,), mechanism)
    time.sleep(0.3)
    alive = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                alive.append(entry.name)
        except OSError:
            continue
    return ok and not alive, f"{detail}; survivors: {alive}"


FORGERS = {
    "sys_exit_0": "import sys\nsys.exit(0)\n",
    "os_exit_0": "import os\nos._exit(0)\n",
    "exit_inside_the_call": "def add(a, b):\n    raise SystemExit(0)\n",
    "always_equal_object": (
        "class Equal:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "def add(a, b):\n    return Equal()\n"
    ),
    "monkeypatch_builtins_and_probe": (
        WRONG_ADD + "import builtins\nbuiltins.AssertionError = type('Never', (Exception,), {})\n"
        "builtins.compile = lambda *a, **k: compile('pass', 'x', 'exec')\n"
        "globals()['__grpo_probe__'] = lambda *a, **k: None\n"
    ),
    "frame_inspection_spray": (
        WRONG_ADD + "import sys, json, os\n"
        "frame, found = sys._getframe(), []\n"
        "while frame is not None:\n    found += list(frame.f_locals.values()) + list(frame.f_globals.values())\n"
        "    frame = frame.f_back\n"
        "numbers = sorted({v for v in found if type(v) is int} | {0, 1, True})\n"
        "send = next(v for v in found if callable(v) and getattr(v, '__name__', '') == 'send')\n"
        "for value in numbers:\n    send({'k': 'probe', 'a': 0, 'v': [value]})\n"
        "send({'k': 'test', 'i': 0, 'ok': True})\nsend({'k': 'done'})\n"
        "for fd in range(3, 64):\n    try:\n"
        '        os.write(fd, b\'{"k":"test","i":0,"ok":true}\\nx test 0 pass\\n\')\n    except OSError:\n'
        "        pass\n"
        "os._exit(0)\n"
    ),
    "harness_patch": (
        WRONG_ADD + "import sys\nframe = sys._getframe()\n"
        "while frame is not None:\n    if 'encode' in frame.f_globals:\n"
        "        frame.f_globals['encode'] = lambda value, depth=0: True\n    frame = frame.f_back\n"
    ),
    "channel_flood": WRONG_ADD + "import os\nfor fd in range(3, 64):\n    try:\n"
    '        os.write(fd, b\'{"k":"probe","a":0,"v":[5]}\\n\' * 10)\n    except OSError:\n        pass\n',
}


def forged_pass_is_impossible(mechanism: str, forger: str) -> tuple[bool, str]:
    return _judged(FORGERS[forger], ADD_TEST, (False,), mechanism)


def parent_cannot_be_signalled(mechanism: str) -> tuple[bool, str]:
    """SIGUSR1 to our PID, to our group and to every process the code can reach never arrives here."""
    received: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    me = os.getpid()
    code = (
        "import os, signal\ntried = []\n"
        f"for target in ({me}, -{os.getpgrp()}):\n"
        "    try:\n        os.kill(target, signal.SIGUSR1)\n        tried.append(target)\n    except OSError:\n"
        "        pass\n"
        "def add(a, b):\n    return a + b\n"
    )
    try:
        ok, detail = _judged(code, ADD_TEST, (True,), mechanism)
        kill_all = "import os, signal\nos.kill(-1, signal.SIGUSR1)\n"
        everyone, _ = _judged(kill_all, ("assert 1 == 1",), (True,), mechanism)
        time.sleep(0.2)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    return ok and not received, f"{detail}; kill(-1) run ok={everyone}; signals received here: {received}"


def secrets_are_unreadable(mechanism: str) -> tuple[bool, str]:
    """World-readable and private files outside the job, and our environment, stay out of reach."""
    token = f"SECRET-{uuid.uuid4().hex}"
    public = Path(f"/tmp/grpo-secret-{uuid.uuid4().hex}")
    public.write_text(token)
    public.chmod(0o644)
    private = Path.cwd() / f".grpo-secret-{uuid.uuid4().hex}"
    private.write_text(token)
    private.chmod(0o600)
    os.environ["GRPO_TEST_SECRET"] = token
    here = Path(__file__).resolve()
    code = (
        "import os\nseen = ''\n"
        f"for path in ({str(public)!r}, {str(private)!r}, {str(here)!r}, '/proc/1/environ', '/etc/shadow'):\n"
        "    try:\n        seen += open(path, errors='replace').read()\n    except OSError:\n        pass\n"
        "seen += repr(dict(os.environ))\n"
    )
    try:
        return _judged(code, (f"assert {token!r} in seen", "assert 'sandbox_cases' in seen"), (False, False), mechanism)
    finally:
        public.unlink()
        private.unlink()
        os.environ.pop("GRPO_TEST_SECRET", None)


def no_nested_user_namespace(mechanism: str) -> tuple[bool, str]:
    """The code cannot create a user namespace of its own (where it would hold capabilities again)."""
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "nested = 'created' if libc.unshare(0x10000000) == 0 else os.strerror(ctypes.get_errno())\n"
    )
    return _judged(code, ("assert nested == 'created'",), (False,), mechanism)


CASES: dict[str, Callable[[str], tuple[bool, str]]] = {
    "correct_solution_passes": correct_solution_passes,
    "network_connect_fails": network_connect_fails,
    "nothing_persists_outside": nothing_persists_outside,
    "no_process_survives": no_process_survives,
    "parent_cannot_be_signalled": parent_cannot_be_signalled,
    "secrets_are_unreadable": secrets_are_unreadable,
    "no_nested_user_namespace": no_nested_user_namespace,
    **{f"forged_pass_{name}": (lambda m, n=name: forged_pass_is_impossible(m, n)) for name in FORGERS},
}


def run_case(name: str, mechanism: str) -> tuple[bool, str]:
    return CASES[name](mechanism)


if __name__ == "__main__":
    results = {}
    for case in CASES:
        try:
            results[case] = run_case(case, sys.argv[1])
        except Exception as exc:  # report, do not stop: the root test shows every failing case
            results[case] = (False, f"{type(exc).__name__}: {exc}")
    print(json.dumps(results))
