"""Final-answer extraction and comparison for the `exact_match` reward.

Completion: the content of the last `\\boxed{...}` (or `\\fbox{...}`, nested braces allowed); else
the text after the last `####` on its line (GSM8K style); else the last number in the text.
Reference answer: the same `\\boxed` / `####` extraction, else the whole answer text.
Comparison: numbers compare by value within a relative tolerance ("1,000" = "1000.0" = "$1000",
"3/4" = "\\frac{3}{4}" = "0.75", "50%" = "50"); anything else compares as a normalised string
(case-folded, whitespace removed, `\\text{}` and `$` wrappers and a trailing period dropped).
"""

from __future__ import annotations

import math
import re

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASH = "####"
# A number: optional sign not glued to a word or digit before it (so "3-5" ends with "5"),
# digits with proper thousands groups or plain digits, optional decimals and exponent.
_NUMBER = re.compile(
    r"(?:(?<![\w)])[-+])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\d])|(?:(?<![\w)])[-+])?\.\d+"
)
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_FRAC = re.compile(r"^([-+]?)\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...}/\\fbox{...} with balanced braces, or None."""
    starts = [m.end() for m in _BOX.finditer(text)]
    for start in reversed(starts):
        depth, i = 1, start
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start : i - 1].strip()
    return None


def after_hashes(text: str) -> str | None:
    """Text after the last '####' up to the end of that line, or None when there is none or it is empty."""
    at = text.rfind(_HASH)
    if at < 0:
        return None
    value = text[at + len(_HASH) :].strip().split("\n", 1)[0].strip()
    return value or None


def last_number(text: str) -> str | None:
    matches = _NUMBER.findall(text)
    return matches[-1] if matches else None


def completion_answer(text: str) -> str | None:
    """The final answer a completion gives (boxed, then ####, then last number), or None."""
    for extract in (last_boxed, after_hashes, last_number):
        value = extract(text)
        if value is not None:
            return value
    return None


def reference_answer(text: str) -> str:
    """The final answer inside a reference (boxed, then ####), else the whole stripped text."""
    return last_boxed(text) or after_hashes(text) or text.strip()


def _unwrap(text: str) -> str:
    value = _TEXT_WRAP.sub(r"\1", text.strip())
    value = value.strip().strip("$").strip()
    return value[:-1].strip() if value.endswith(".") else value


def parse_number(text: str) -> float | None:
    """The value of a formatted number ("1,000", "$5", "50%", "3/4", "\\frac{3}{4}"), or None."""
    value = _unwrap(text).replace("\\$", "").replace("\\!", "").replace("\\,", "").replace("\\%", "%")
    value = value.replace(" ", "").lstrip("$").rstrip("%")
    frac = _FRAC.match(value)
    if frac:
        sign, num, den = frac.groups()
        value = f"{sign}{num}/{den}"
    if _THOUSANDS.fullmatch(value):
        value = value.replace(",", "")
    if value.count("/") == 1:
        num_text, den_text = value.split("/")
        num, den = _to_float(num_text), _to_float(den_text)
        if num is None or den is None or den == 0:
            return None
        return num / den
    return _to_float(value)


def _to_float(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def normalise_text(text: str) -> str:
    return re.sub(r"\s+", "", _unwrap(text)).casefold()


def answers_match(predicted: str | None, reference: str, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Whether a completion's extracted answer equals the reference's final answer."""
    if predicted is None:
        return False
    ref = reference_answer(reference)
    a, b = parse_number(predicted), parse_number(ref)
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
    return normalise_text(predicted) == normalise_text(ref)
