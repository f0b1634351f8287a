"""Load a user callable named `module.path:function` or `path/to/file.py:function`.

Used for data transforms and user reward functions. The part after the last ':' may be dotted
(`Class.method`). A reference whose left part ends in `.py` or contains a path separator is a file,
imported under a private module name; otherwise it is a module imported from `sys.path` plus the
current directory (appended, so it never shadows installed packages). Every failure is an
`InputError` that names the reference and what to fix.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from grpo_pilot.errors import InputError


def is_callable_ref(text: str) -> bool:
    """Whether `text` has the shape `left:name` with an identifier (possibly dotted) after the colon."""
    if ":" not in text:
        return False
    left, name = text.rsplit(":", 1)
    return bool(left) and all(part.isidentifier() for part in name.split("."))


def _is_file_ref(left: str) -> bool:
    return left.endswith(".py") or "/" in left or os.sep in left


def _import_file(path_text: str, ref: str, role: str) -> ModuleType:
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise InputError(
            f"The {role} '{ref}' points at '{path_text}', which is not a file.",
            f"Give a path to a .py file (relative to {os.getcwd()}) or an importable module name.",
        )
    resolved = path.resolve()
    name = f"grpo_pilot_user_{resolved.stem}_{hashlib.sha1(str(resolved).encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise InputError(f"The {role} '{ref}': '{path_text}' cannot be loaded as Python.", "Use a .py file.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file failed at import time: report it, do not crash
        del sys.modules[name]
        raise InputError(
            f"The {role} '{ref}': importing '{path_text}' raised {type(exc).__name__}: {exc}.",
            "Fix the file so that it imports cleanly (try `python -c 'import runpy; runpy.run_path(PATH)'`).",
        ) from exc
    return module


def _import_module(module_name: str, ref: str, role: str) -> ModuleType:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise InputError(
            f"The {role} '{ref}': module '{module_name}' is not importable ({exc}).",
            "Install the package, run from the directory that holds it, or give a file: path/to/file.py:function.",
        ) from exc
    except Exception as exc:
        raise InputError(
            f"The {role} '{ref}': importing module '{module_name}' raised {type(exc).__name__}: {exc}.",
            "Fix the module so that it imports cleanly.",
        ) from exc


def _public_functions(module: ModuleType) -> list[str]:
    return sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_") and inspect.isfunction(v))


def load_callable(ref: str, *, role: str) -> Callable[..., Any]:
    """The callable named by `ref`; `role` ('data transform', 'reward function') appears in errors."""
    if not is_callable_ref(ref):
        raise InputError(
            f"The {role} '{ref}' is not of the form module:function or path/to/file.py:function.",
            "Example: mypkg.rewards:score or ./my_reward.py:score.",
        )
    left, name = ref.rsplit(":", 1)
    module = _import_file(left, ref, role) if _is_file_ref(left) else _import_module(left, ref, role)
    target: Any = module
    for part in name.split("."):
        if not hasattr(target, part):
            available = ", ".join(_public_functions(module)) or "none"
            raise InputError(
                f"The {role} '{ref}': '{left}' has no attribute '{name}'.",
                f"Functions defined there: {available}.",
            )
        target = getattr(target, part)
    if not callable(target):
        raise InputError(f"The {role} '{ref}' is a {type(target).__name__}, not a function.", "Point at a function.")
    return target
