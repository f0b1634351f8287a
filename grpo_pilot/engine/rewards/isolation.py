"""How this machine isolates untrusted code: bubblewrap, util-linux `unshare`, or nothing.

Both sandboxes give the code the same thing: new user, network (loopback only), mount, PID, IPC and
UTS namespaces; a read-only root that holds only /usr (with the /bin, /lib, ... links), the Python
interpreter's prefix, a fresh /proc and a minimal /dev; private size-limited tmpfs at /tmp and
/dev/shm; no capabilities, no new privileges, no nested user namespaces. The home directories, /etc,
/work, /root, the system /tmp, the run's files, other processes and the network are not there. When
the first process of the PID namespace ends, the kernel kills every process left in it (setsid and
double forks included). As root, the sandbox is started as `nobody` (uid 65534), so its processes
own nothing outside; as a normal user it runs under that user's uid, which the namespaces keep away
from the user's files and processes.

- bubblewrap (`bwrap`, https://github.com/containers/bubblewrap): one command line, `BWRAP_FLAGS`.
- util-linux `unshare` plus `mount`, `pivot_root` and `setpriv`: `unshare` creates the namespaces and
  a short POSIX shell script (`UNSHARE_SETUP`) builds the same root, pivots into it and drops every
  capability before it execs the interpreter.

`probe(mechanism)` runs a small script through a mechanism and reports what it saw (`IsolationReport`);
`choose("auto")` prefers bubblewrap, then unshare. The interpreter used inside is the first of this
Python's base interpreter and the system's python3 that the sandbox user can execute (`interpreter_for`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Literal, Sequence

from pydantic import Field

from grpo_pilot.models import Frozen

Mechanism = Literal["bwrap", "unshare", "none"]
NOBODY_ID = 65534
SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
ENV = {"HOME": "/tmp", "TMPDIR": "/tmp", "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "USER": "sandbox"}
ENV_THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
PROBE_TIMEOUT_S = 20.0

# bubblewrap: every namespace (net included), no nested user namespaces, killed with its parent, own session.
BWRAP_FLAGS = ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session")

# Runs as root of the new user namespace (all capabilities there, none outside). $1 python, $2 its prefix
# ('' when under /usr), $3 /tmp bytes, $4 /dev/shm bytes, $5 the program for python -c, $6 its argument.
UNSHARE_SETUP = r"""
set -eu
PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -n -t tmpfs -o size=4m,mode=0755 sandbox-root /tmp
cd /tmp
mkdir usr proc dev tmp .oldroot
ro_bind() { mount -n --bind "$1" "$2" && mount -n -o remount,bind,ro "$2"; }
ro_bind /usr usr
for link in bin sbin lib lib32 lib64 libx32; do
  if [ -L "/$link" ]; then ln -s "$(readlink "/$link")" "$link"
  elif [ -d "/$link" ]; then mkdir "$link" && ro_bind "/$link" "$link"; fi
done
if [ -n "$2" ]; then mkdir -p ".$2" && ro_bind "$2" ".$2"; fi
mount -n -t proc proc proc
echo 0 > proc/sys/user/max_user_namespaces
ro_bind proc/sys proc/sys
mount -n -t tmpfs -o size="$3",mode=1777 sandbox-tmp tmp
mount -n -t tmpfs -o size=64k,mode=0755 sandbox-dev dev
for node in null zero full random urandom; do : > "dev/$node" && mount -n --bind "/dev/$node" "dev/$node"; done
mkdir dev/shm && mount -n -t tmpfs -o size="$4",mode=1777 sandbox-shm dev/shm
ln -s /proc/self/fd dev/fd
pivot_root . .oldroot
cd /
umount -n -l /.oldroot
rmdir /.oldroot
mount -n -o remount,bind,ro /
cd /tmp
exec setpriv --no-new-privs --inh-caps=-all --ambient-caps=-all --bounding-set=-all \
  --securebits=+noroot,+noroot_locked,+no_setuid_fixup,+no_setuid_fixup_locked,+keep_caps_locked \
  -- "$1" -I -S -c "$5" "$6"
"""

PROBE_SCRIPT = r"""
import json, os, socket, sys
facts = {"uid": os.getuid(), "pid": os.getpid(), "processes": sum(p.isdigit() for p in os.listdir("/proc"))}
def attempt(fn):
    try:
        fn()
        return "allowed"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
facts["network"] = attempt(lambda: socket.create_connection(("1.1.1.1", 53), timeout=2).close())
facts["root_write"] = attempt(lambda: open("/grpo-probe", "w").close())
facts["tmp_write"] = attempt(lambda: open("/tmp/grpo-probe", "w").close())
facts["root_entries"] = sorted(os.listdir("/"))
facts["host_tmp_marker"] = os.path.exists(sys.argv[1])
print(json.dumps(facts))
"""


class Interpreter(Frozen):
    """The Python that runs inside the sandbox."""

    path: str = Field(description="Executable (real path).")
    prefix: str = Field(description="sys.prefix, bound read-only into the sandbox unless under /usr.")
    version: str = Field(description="Python version, e.g. 3.11.2.")


class IsolationReport(Frozen):
    """What one mechanism gives on this machine, from a probe run inside it."""

    mechanism: Mechanism
    available: bool
    reason: str = Field(default="", description="Why it is not available (empty when it is).")
    tool: str = Field(default="", description="The tool and its version.")
    runs_as: str = Field(default="", description="Whose uid the sandbox has outside.")
    interpreter: Interpreter | None = None
    facts: dict[str, object] = Field(default_factory=dict, description="What the probe saw inside.")


def sandbox_uid() -> int | None:
    """The uid the sandbox is started as: nobody when we are root, else ourselves (None = no switch)."""
    return NOBODY_ID if os.geteuid() == 0 else None


def as_user(uid: int | None) -> dict[str, object]:
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}


@lru_cache(maxsize=4)
def interpreter_for(uid: int | None) -> Interpreter | None:
    """The first Python (this one's base interpreter, then the system python3) `uid` can run in isolation."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    show = "import sys, json; print(json.dumps([sys.prefix, '%d.%d.%d' % sys.version_info[:3]]))"
    seen: set[str] = set()
    for candidate in (base, *SYSTEM_PYTHONS):
        path = os.path.realpath(candidate)
        if path in seen or not os.path.isfile(path):
            continue
        seen.add(path)
        try:
            out = subprocess.run(
                [path, "-I", "-S", "-c", show], capture_output=True, timeout=PROBE_TIMEOUT_S, cwd="/", **as_user(uid)
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0:
            prefix, version = json.loads(out.stdout)
            return Interpreter(path=path, prefix=os.path.realpath(prefix), version=version)
    return None


def _extra_prefix(interpreter: Interpreter) -> str:
    """The interpreter's prefix when it is not already under /usr ('' otherwise)."""
    prefix = Path(interpreter.prefix)
    return "" if prefix == Path("/usr") or Path("/usr") in prefix.parents else str(prefix)


def bwrap_command(interpreter: Interpreter, program: str, argument: str, tmp_bytes: int) -> list[str]:
    """bwrap argv running `python -I -S -c program argument` in the sandbox described above."""
    args = ["bwrap", *BWRAP_FLAGS, "--ro-bind", "/usr", "/usr"]
    for link in SYSTEM_LINKS:
        host = Path("/") / link
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{link}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{link}"]
    if prefix := _extra_prefix(interpreter):
        args += ["--ro-bind", prefix, prefix]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    args += ["--size", str(tmp_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
    for key, value in {**ENV, **ENV_THREADS}.items():
        args += ["--setenv", key, value]
    return [*args, "--hostname", "sandbox", "--", interpreter.path, "-I", "-S", "-c", program, argument]


def unshare_command(interpreter: Interpreter, program: str, argument: str, tmp_bytes: int) -> list[str]:
    """unshare argv running the same program in the same kind of sandbox (see `UNSHARE_SETUP`)."""
    namespaces = ["--user", "--map-root-user", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork"]
    return [
        "unshare",
        *namespaces,
        "--kill-child",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        UNSHARE_SETUP,
        "sandbox-setup",
        interpreter.path,
        _extra_prefix(interpreter),
        str(tmp_bytes),
        str(tmp_bytes),
        program,
        argument,
    ]


def command(
    *, mechanism: Mechanism, interpreter: Interpreter, program: str, argument: str, tmp_bytes: int
) -> list[str]:
    if mechanism == "bwrap":
        return bwrap_command(interpreter, program, argument, tmp_bytes)
    if mechanism == "unshare":
        return unshare_command(interpreter, program, argument, tmp_bytes)
    return [interpreter.path, "-I", "-S", "-c", program, argument]


def launch_env(mechanism: Mechanism) -> dict[str, str]:
    """Environment of the launcher process (bwrap clears it for the code; unshare's script passes it on)."""
    if mechanism == "unshare":
        return {**ENV, **ENV_THREADS, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    return {**ENV, **ENV_THREADS, "PATH": os.defpath}


def _tool(mechanism: Mechanism) -> str | None:
    if mechanism == "none":
        return ""
    name = "bwrap" if mechanism == "bwrap" else "unshare"
    found = shutil.which(name, path=os.defpath + ":/usr/sbin:/sbin")
    if found is None or (
        mechanism == "unshare"
        and not all(
            shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin") for t in ("mount", "pivot_root", "setpriv", "umount")
        )
    ):
        return None
    try:
        version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    return f"{found} ({version.strip().splitlines()[0] if version.strip() else 'version unknown'})"


def _who(uid: int | None) -> str:
    return "nobody (uid 65534; grpo-run is root)" if uid == NOBODY_ID else f"uid {os.getuid()} (this user)"


@lru_cache(maxsize=3)
def probe(mechanism: Mechanism) -> IsolationReport:
    """Run `PROBE_SCRIPT` through `mechanism` and report what the code inside could do."""
    uid = sandbox_uid() if mechanism != "none" else None
    tool = _tool(mechanism)
    if tool is None:
        missing = "bubblewrap (bwrap) is not installed" if mechanism == "bwrap" else "util-linux tools missing"
        return IsolationReport(mechanism=mechanism, available=False, reason=missing)
    interpreter = interpreter_for(uid)
    if interpreter is None:
        return IsolationReport(
            mechanism=mechanism, available=False, tool=tool, reason=f"no Python that {_who(uid)} can execute"
        )
    marker = Path(f"/tmp/grpo-pilot-probe-{os.getpid()}")
    marker.touch()
    try:
        out = subprocess.run(
            command(
                mechanism=mechanism,
                interpreter=interpreter,
                program=PROBE_SCRIPT,
                argument=str(marker),
                tmp_bytes=1 << 20,
            ),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            env=launch_env(mechanism),
            cwd="/",
            **as_user(uid),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return IsolationReport(mechanism=mechanism, available=False, tool=tool, reason=f"could not start: {exc}")
    finally:
        marker.unlink(missing_ok=True)
    try:
        facts = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        reason = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        return IsolationReport(mechanism=mechanism, available=False, tool=tool, reason=reason[:300])
    problems = _missing_isolation(mechanism, facts)
    return IsolationReport(
        mechanism=mechanism,
        available=not problems,
        reason="; ".join(problems),
        tool=tool,
        runs_as=_who(uid),
        interpreter=interpreter,
        facts=facts,
    )


def _missing_isolation(mechanism: Mechanism, facts: dict[str, object]) -> list[str]:
    """What a sandbox probe shows is not isolated (nothing is expected of 'none')."""
    if mechanism == "none":
        return []
    problems = []
    if facts.get("network") == "allowed":
        problems.append("the network is reachable")
    if facts.get("root_write") == "allowed":
        problems.append("the root is writable")
    if facts.get("host_tmp_marker"):
        problems.append("the system /tmp is visible")
    if not isinstance(facts.get("processes"), int) or int(facts["processes"]) > 3:  # type: ignore[call-overload]
        problems.append("other processes are visible")
    return problems


def choose(requested: Literal["auto", "bwrap", "unshare"]) -> IsolationReport:
    """The report of the mechanism `requested` ("auto": bubblewrap, else unshare); may be unavailable."""
    if requested != "auto":
        return probe(requested)
    first = probe("bwrap")
    return first if first.available else (probe("unshare") if probe("unshare").available else first)


def describe_reports(reports: Sequence[IsolationReport]) -> str:
    """Plain-text lines for `grpo-run --check-sandbox`."""
    lines = []
    for r in reports:
        name = {"bwrap": "bubblewrap", "unshare": "util-linux unshare", "none": "no sandbox"}[r.mechanism]
        head = f"{name}: {'available' if r.available else 'NOT available'}"
        lines.append(head + (f" ({r.reason})" if r.reason else ""))
        if r.tool:
            lines.append(f"  tool: {r.tool}")
        if r.available:
            assert r.interpreter is not None
            f = r.facts
            lines.append(f"  runs as: {r.runs_as}; uid inside the sandbox {f.get('uid')}")
            lines.append(f"  interpreter: {r.interpreter.path} (Python {r.interpreter.version})")
            lines.append(f"  network: connect to 1.1.1.1:53 -> {f.get('network')}")
            lines.append(f"  processes visible: {f.get('processes')} (own PID {f.get('pid')})")
            entries = ", ".join(map(str, f.get("root_entries") or []))  # type: ignore[call-overload]
            lines.append(f"  root: writing / -> {f.get('root_write')}; entries {entries}")
            lines.append(
                f"  /tmp: private tmpfs (writing -> {f.get('tmp_write')}; "
                f"system /tmp visible: {f.get('host_tmp_marker')})"
            )
    return "\n".join(lines)
