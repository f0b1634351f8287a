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
    alive = _processes_with(marker)
    return ok and not alive, f"{detail}; survivors: {alive}"


# Tests of every shape the parent judges (plain asserts, HumanEval's check(candidate), a __main__ guard,
# two asserts in one test) and shapes it cannot judge (no assert, a raise, an assert under `if`):
# a forger that knows the harness's source must pass none of them with a wrong `add`.
FORGE_TESTS = (
    "assert add(2, 3) == 5",
    "def check(candidate):\n    assert candidate(1, 1) == 2\n    assert candidate(-4, 4) == 0\ncheck(add)",
    "if __name__ == '__main__':\n    assert add(10, 5) == 15",
    "assert add(0, 7) == 7\nassert add(3, 3) == 6",
    "if add(2, 3) != 5:\n    raise AssertionError",
    "add(1, 2)",
    "if add(2, 3) == 5:\n    assert add(2, 3) == 5",
)
NONE_PASS = (False,) * len(FORGE_TESTS)
# every result line the harness writes, for every test and assert id, on every descriptor 0-19
FORGE_ALL = (
    "import os\n"
    "def forge():\n"
    "    lines = [{'k': 'ready', 'user': 'x'}, {'k': 'solution', 'ok': True}]\n"
    "    lines += [{'k': 'test', 'i': i, 'ok': True} for i in range(10)] + [{'k': 'done'}]\n"
    "    data = ''.join(__import__('json').dumps(m) + '\\n' for m in lines).encode()\n"
    "    for fd in range(20):\n"
    "        try:\n            os.write(fd, data)\n        except OSError:\n            pass\n"
)
TOKEN = "tok-" + "5f0c" * 8
FORGERS: dict[str, tuple[str, tuple[bool, ...]]] = {
    "sys_exit_0": ("import sys\nsys.exit(0)\n", NONE_PASS),
    "os_exit_0": ("import os\nos._exit(0)\n", NONE_PASS),
    "fd_forgery_then_os_exit": (WRONG_ADD + FORGE_ALL + "forge()\nos._exit(0)\n", NONE_PASS),
    "fd_forgery_inside_every_call": (
        FORGE_ALL + "def add(a, b):\n    forge()\n    os._exit(0)\n",
        NONE_PASS,
    ),
    "exit_inside_the_call": ("def add(a, b):\n    raise SystemExit(0)\n", NONE_PASS),
    # right on the first test, then forges the end of everything just before an assert it would fail
    "exit_before_a_failing_assert": (
        FORGE_ALL + "def add(a, b):\n    if (a, b) == (-4, 4):\n        forge()\n        os._exit(0)\n"
        "    return a + b\n",
        (True,) + (False,) * (len(FORGE_TESTS) - 1),
    ),
    "always_equal_object": (
        "class Equal:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "def add(a, b):\n    return Equal()\n",
        NONE_PASS,
    ),
    "int_subclass_equal_to_everything": (
        "class Int(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Int(0)\n",
        NONE_PASS,
    ),
    "monkeypatch_builtins_and_probe": (
        WRONG_ADD + "import builtins\nbuiltins.AssertionError = type('Never', (Exception,), {})\n"
        "builtins.compile = lambda *a, **k: compile('pass', 'x', 'exec')\n"
        "builtins.exec = lambda *a, **k: None\n"
        "globals()['__grpo_probe__'] = lambda *a, **k: None\n",
        NONE_PASS,
    ),
    "override_sys_exit_and_atexit": (
        WRONG_ADD + FORGE_ALL + "import sys, atexit\nsys.exit = lambda *a: None\nos._exit = lambda *a: None\n"
        "atexit.register(forge)\nsys.excepthook = lambda *a: forge()\n",
        NONE_PASS,
    ),
    "signal_tricks": (
        WRONG_ADD + FORGE_ALL + "import signal\n"
        "def handler(signum, frame):\n    forge()\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        "for sig in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
        "    signal.signal(sig, handler)\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.05)\n",
        NONE_PASS,
    ),
    "fake_lines_on_stdout_and_stderr": (
        WRONG_ADD + "import sys, os\nfor i in range(8):\n"
        '    line = \'{"k": "test", "i": %d, "ok": true}\' % i\n'
        "    print(line)\n    print(line, file=sys.stderr)\n"
        "    print('test %d pass' % i)\n"
        'sys.stdout.flush()\nos.write(1, b\'{"k": "done"}\\n\')\nos.write(2, b\'{"k": "done"}\\n\')\n',
        NONE_PASS,
    ),
    "kill_the_parent_and_everyone": (
        WRONG_ADD + FORGE_ALL + "import signal\nforge()\n"
        "for target in (os.getppid(), 1, -1, 0):\n"
        "    try:\n        os.kill(target, signal.SIGKILL)\n    except OSError:\n        pass\n",
        NONE_PASS,
    ),
    "frame_inspection_spray": (
        WRONG_ADD + "import sys, json, os\n"
        "frame, found = sys._getframe(), []\n"
        "while frame is not None:\n    found += list(frame.f_locals.values()) + list(frame.f_globals.values())\n"
        "    frame = frame.f_back\n"
        "numbers = sorted({v for v in found if type(v) is int} | {0, 1, True})\n"
        "send = next(v for v in found if callable(v) and getattr(v, '__name__', '') == 'send')\n"
        "for assert_id in range(8):\n    for value in numbers:\n"
        "        send({'k': 'probe', 'a': assert_id, 'v': [value]})\n"
        "for index in range(8):\n    send({'k': 'test', 'i': index, 'ok': True})\n"
        "send({'k': 'done'})\n"
        "os._exit(0)\n",
        NONE_PASS,
    ),
    "harness_patch": (
        WRONG_ADD + "import sys\nframe = sys._getframe()\n"
        "while frame is not None:\n    if 'encode' in frame.f_globals:\n"
        "        frame.f_globals['encode'] = lambda value, depth=0: True\n    frame = frame.f_back\n",
        NONE_PASS,
    ),
    "channel_flood": (
        WRONG_ADD + "import os\nfor fd in range(3, 64):\n    try:\n"
        '        os.write(fd, b\'{"k":"probe","a":0,"v":[5]}\\n\' * 10)\n    except OSError:\n'
        "        pass\n",
        NONE_PASS,
    ),
}


def forged_pass_is_impossible(mechanism: str, forger: str) -> tuple[bool, str]:
    code, expected = FORGERS[forger]
    return _judged(code, FORGE_TESTS, expected, mechanism)


def expected_values_never_enter_the_sandbox(mechanism: str) -> tuple[bool, str]:
    """Code that searches everything it can read (objects, frames, its own memory, /proc, environment,
    files) for the test's expected value finds nothing: that value stays in grpo-run."""
    code = (
        "import gc, os, re, sys\npattern = re.compile(rb'tok-[0-9a-f]{32}')\nfound = []\n"
        "def scan(data):\n    found.extend(m.decode() for m in pattern.findall(data))\n"
        "for obj in gc.get_objects():\n    try:\n        scan(repr(obj).encode('utf-8', 'replace'))\n"
        "    except Exception:\n        pass\n"
        "frame = sys._getframe()\nwhile frame is not None:\n"
        "    scan(repr(frame.f_locals).encode('utf-8', 'replace'))\n    frame = frame.f_back\n"
        "for path in ('/proc/self/cmdline', '/proc/self/environ', '/proc/1/cmdline', '/proc/1/environ'):\n"
        "    try:\n        scan(open(path, 'rb').read())\n    except OSError:\n        pass\n"
        "budget = 256 << 20\n"
        "with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:\n"
        "    for line in maps:\n        start, end = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "        if 'r' not in line.split()[1] or end - start > budget:\n            continue\n"
        "        try:\n            mem.seek(start)\n            scan(mem.read(end - start))\n"
        "            budget -= end - start\n        except (OSError, ValueError, OverflowError):\n"
        "            pass\n"
        "def token():\n    return found[0] if found else 'nothing found'\n"
    )
    ok, detail = _judged(code, (f"assert token() == {TOKEN!r}",), (False,), mechanism)
    seen = run_tests(code + "count = len(found)\n", ("assert count == 0",), LIMITS, isolation=mechanism)  # type: ignore[arg-type]
    return ok and seen.passed == (True,), f"{detail}; tokens found inside: none={seen.passed}"


def honest_solution_passes_what_can_be_judged(mechanism: str) -> tuple[bool, str]:
    """The right `add` passes every judgeable shape of FORGE_TESTS and none of the others."""
    return _judged("def add(a, b):\n    return a + b\n", FORGE_TESTS, (True,) * 4 + (False,) * 3, mechanism)


def no_setsid_child_survives_os_exit(mechanism: str) -> tuple[bool, str]:
    """A new session's grandchild, then os._exit of the code: the grandchild is gone with the job."""
    marker = f"grpo-escapee-{uuid.uuid4().hex}"
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\nos._exit(0)\n"
    )
    ok, detail = _judged(code, ("assert 1 + 1 == 2",), (False,), mechanism)
    alive = _processes_with(marker)
    return ok and not alive, f"{detail}; survivors: {alive}"


def _processes_with(marker: str) -> list[str]:
    time.sleep(0.3)
    alive = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                alive.append(entry.name)
        except OSError:
            continue
    return alive


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
    "no_setsid_child_survives_os_exit": no_setsid_child_survives_os_exit,
    "expected_values_never_enter_the_sandbox": expected_values_never_enter_the_sandbox,
    "honest_solution_passes_what_can_be_judged": honest_solution_passes_what_can_be_judged,
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
