"""`Calibration`: measured values of the estimator's constants for one device kind and software stack.

A calibration is fitted from measured runs (`grpo_pilot.tuner.calibrate`, from a grpo-tune study) and
stored as JSON. It holds a complete `Overheads` and `TimeCoefficients` (the analytic defaults with the
fitted fields replaced), what was fitted and what stayed analytic (with the reason), and the fit's
error before and after on the trials it came from.

It applies to plans for the catalog GPU it was measured on (`plan_gpu`; "cpu" for the cpu
pseudo-device) under the same software: the torch, transformers and vLLM versions it recorded
(vLLM releases differ by GBs of memory and by their step overheads: reference/tuning.md). A plan
for another GPU or other versions does not get it.

Where the planner looks: `grpo-plan --calibration FILE`; else the default location
`$GRPO_PILOT_CALIBRATION_DIR/<plan GPU>.json` (the directory defaults to
`~/.cache/grpo-pilot/calibration`), read when present; else the calibrations packaged with grpo-pilot
(`planner/calibrations/<GPU>.json`, fitted from real GPU runs: `tuner/measured_runs.py`), whatever the
software versions: for their own GPU whole, for any other GPU only their host-side constants
(`time_coefficients.HOST_SIDE_FIELDS`: the host's op dispatch, which does not depend on the GPU) while the
device's rates stay the published ones (the MAMF table, datasheets) — `PlanInputs.constant_sources` says
which is which for a plan (its provenance records it). `--no-calibration` uses none. This module is pure
apart from `load_calibration`, `save_calibration` and reading the packaged files (file IO at the edge); it
never imports torch.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import Field, ValidationError

from grpo_pilot.atomic import atomic_write_text
from grpo_pilot.errors import InputError
from grpo_pilot.inputs import read_json_file
from grpo_pilot.models import Frozen
from grpo_pilot.planner.evaluate import PlanInputs
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS, Overheads
from grpo_pilot.planner.plan import Plan
from grpo_pilot.planner.recheck import plan_inputs
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS, HOST_SIDE_FIELDS, TimeCoefficients

CALIBRATION_SCHEMA = 1
CALIBRATION_DIR_ENV = "GRPO_PILOT_CALIBRATION_DIR"
DEFAULT_CALIBRATION_DIR = Path("~/.cache/grpo-pilot/calibration")
# Software whose versions a calibration must match (each one it recorded as installed).
MATCHED_COMPONENTS = ("torch", "transformers", "vllm")
PACKAGED_DIR = Path(__file__).resolve().parent / "calibrations"
PACKAGED_PREFIX = "packaged:"


class FittedValue(Frozen):
    """One constant the measurements determined."""

    name: str = Field(description="'time.<TimeCoefficients field>' or 'memory.<Overheads field>'.")
    analytic: float = Field(description="The documented default it replaces.")
    fitted: float
    sensitivity: float = Field(
        description="RMS over the fitted observations of d ln(prediction) / d ln(value) at the fit."
    )
    method: str = Field(description="How it was fitted, from which measurements.")


class KeptValue(Frozen):
    """A constant left at its analytic default, and why the trials could not determine it."""

    name: str
    reason: str


class FitError(Frozen):
    """Prediction error on the fitted trials: geometric RMS factor exp(sqrt(mean(ln(pred / measured)²)))."""

    tokens_per_s_before: float = Field(ge=1.0, description="Step tokens/s, analytic constants.")
    tokens_per_s_after: float = Field(ge=1.0, description="Step tokens/s, fitted constants.")
    phase_time_before: float = Field(ge=1.0, description="Per-phase seconds, analytic constants.")
    phase_time_after: float = Field(ge=1.0, description="Per-phase seconds, fitted constants.")
    rss_before: float | None = Field(default=None, description="Per-phase process RSS (cpu), analytic.")
    rss_after: float | None = Field(default=None, description="Per-phase process RSS (cpu), fitted.")


class Calibration(Frozen):
    """The calibration file (calibration.json)."""

    schema_version: int = CALIBRATION_SCHEMA
    name: str = Field(min_length=1, description="Shown in the plan's provenance.")
    device_kind: str = Field(description="The accelerator the trials ran on ('cpu' or the CUDA device name).")
    plan_gpu: str = Field(description="Catalog GPU of the plans it applies to ('cpu', 'H100-80G', ...).")
    versions: dict[str, str | None] = Field(description="Software versions of the trials (torch, transformers, ...).")
    overheads: Overheads = Field(default=DEFAULT_OVERHEADS)
    time_coefficients: TimeCoefficients = Field(default=DEFAULT_TIME_COEFFICIENTS)
    fitted: tuple[FittedValue, ...] = ()
    kept_analytic: tuple[KeptValue, ...] = ()
    num_trials: int = Field(ge=1, description="Measured trials the fit used.")
    num_observations: int = Field(ge=0, description="(trial, phase) times the time fit used.")
    fit_error: FitError
    source: str = Field(default="", description="Where the trials came from (study and storage).")
    created_at: str = Field(description="UTC time of the fit, ISO 8601.")

    def to_json(self) -> str:
        return self.model_dump_json(indent=2) + "\n"

    def pinned_versions(self) -> dict[str, str]:
        """The versions a plan's environment must match (the matched components that were installed)."""
        return {k: v for k, v in self.versions.items() if k in MATCHED_COMPONENTS and v is not None}


def default_calibration_path(plan_gpu: str, environ: dict[str, str] | None = None) -> Path:
    """`$GRPO_PILOT_CALIBRATION_DIR/<plan_gpu>.json` (directory default ~/.cache/grpo-pilot/calibration)."""
    env = os.environ if environ is None else environ
    directory = Path(env.get(CALIBRATION_DIR_ENV) or DEFAULT_CALIBRATION_DIR).expanduser()
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in plan_gpu)
    return directory / f"{safe}.json"


def mismatch(calibration: Calibration, plan_gpu: str, versions: dict[str, str | None]) -> str | None:
    """Why `calibration` does not apply to a plan for `plan_gpu` under `versions` (None: it applies)."""
    if calibration.plan_gpu != plan_gpu:
        return f"it was measured for {calibration.plan_gpu} ({calibration.device_kind}), the plan is for {plan_gpu}"
    differ = [
        f"{name} {want} (installed: {versions.get(name) or 'none'})"
        for name, want in calibration.pinned_versions().items()
        if versions.get(name) != want
    ]
    if differ:
        return "it was measured with " + ", ".join(differ)
    return None


def save_calibration(calibration: Calibration, path: str | Path) -> Path:
    """Write calibration.json atomically (temp file + rename)."""
    return atomic_write_text(path, calibration.to_json())


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration file; a missing, corrupt or foreign file is an `InputError` saying what to do."""
    p = Path(path)
    redo = "Fit it again with `grpo-tune PLAN --config RUN --calibrate-only --out DIR` (writes DIR/calibration.json)."
    # the input layer: a regular file of bounded size (a FIFO or /dev/zero is refused, not read), strict JSON
    # nested at most MAX_JSON_DEPTH levels (no RecursionError)
    raw = read_json_file(p, "calibration file", hint=redo)
    if not isinstance(raw, dict) or "schema_version" not in raw or "device_kind" not in raw:
        raise InputError(f"'{p}' is not a grpo-pilot calibration file (no schema_version/device_kind).", redo)
    if raw["schema_version"] != CALIBRATION_SCHEMA:
        raise InputError(
            f"'{p}' has calibration schema_version {raw['schema_version']}; this grpo-pilot reads "
            f"version {CALIBRATION_SCHEMA}.",
            redo,
        )
    try:
        return Calibration.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise InputError(
            f"'{p}' is a damaged calibration file: field '{where}': {first['msg']} ({exc.error_count()} problem(s)).",
            redo,
        ) from None


def calibrated(inputs: PlanInputs, calibration: Calibration, path: str | Path | None = None) -> PlanInputs:
    """`inputs` with the calibration's constants, its name, file and versions (for the provenance)."""
    return inputs.model_copy(
        update={
            "overheads": calibration.overheads,
            "time_coefficients": calibration.time_coefficients,
            "calibration": calibration.name,
            "calibration_file": str(path) if path is not None else None,
            "calibration_versions": tuple(sorted(calibration.versions.items())),
        }
    )


@lru_cache(maxsize=1)
def packaged_calibrations() -> dict[str, Calibration]:
    """The calibrations shipped with grpo-pilot, by plan GPU."""
    return {cal.plan_gpu: cal for cal in (load_calibration(p) for p in sorted(PACKAGED_DIR.glob("*.json")))}


def host_side_only(calibration: Calibration) -> Calibration:
    """`calibration` with only its host-side time constants kept (the analytic defaults elsewhere)."""
    host = {name: getattr(calibration.time_coefficients, name) for name in HOST_SIDE_FIELDS}
    return calibration.model_copy(
        update={
            "name": f"{calibration.name} (host-side constants only)",
            "overheads": DEFAULT_OVERHEADS,
            "time_coefficients": DEFAULT_TIME_COEFFICIENTS.model_copy(update=host),
        }
    )


def packaged_for(plan_gpu: str) -> tuple[Calibration, str] | None:
    """The packaged calibration for `plan_gpu` (whole), or the host-side part of one measured on another
    GPU; with the pseudo-path the plan's provenance records. None on the cpu pseudo-device (its host is
    the device: grpo-tune calibrates it) or when none is packaged."""
    packaged = packaged_calibrations()
    if plan_gpu == "cpu" or not packaged:
        return None
    if plan_gpu in packaged:
        return packaged[plan_gpu], f"{PACKAGED_PREFIX}{plan_gpu}"
    source_gpu = sorted(packaged)[0]
    return host_side_only(packaged[source_gpu]), f"{PACKAGED_PREFIX}{source_gpu}:host"


def choose_calibration(
    inputs: PlanInputs,
    path: str | Path | None,
    *,
    use_default: bool,
    versions: dict[str, str | None],
    environ: dict[str, str] | None = None,
) -> tuple[PlanInputs, str | None]:
    """The inputs with the calibration that applies, and a note saying which (or why none) — or None.

    An explicit `path` must apply (else `InputError`); the default file (`default_calibration_path`) is
    used when present and matching, and skipped with a note (recorded in the plan's provenance) when it
    was measured on another GPU or other software. A corrupt file is an `InputError` either way."""
    gpu = inputs.cluster.gpu.name
    if path is not None:
        cal = load_calibration(path)
        why = mismatch(cal, gpu, versions)
        if why:
            raise InputError(
                f"The calibration '{path}' ({cal.name}) does not apply to this plan: {why}.",
                "Use a calibration fitted on this GPU with this software (grpo-tune ... --calibrate-only), "
                "or plan without --calibration.",
            )
        return calibrated(inputs, cal, path), f"calibration '{cal.name}' applied ({path})"
    if not use_default:
        return inputs, None
    default = default_calibration_path(gpu, environ)
    if not os.path.lexists(default):  # anything there (a pipe, a directory) is read, and refused by name
        packaged = packaged_for(gpu)
        if packaged is None:
            return inputs, None
        cal, where = packaged
        return calibrated(inputs, cal, where), f"calibration '{cal.name}' applied (packaged with grpo-pilot)"
    try:
        cal = load_calibration(default)
    except InputError as exc:
        raise InputError(
            exc.message, f"Delete or replace {default} (the default calibration for {gpu}), or pass --no-calibration."
        ) from None
    why = mismatch(cal, gpu, versions)
    if why:
        skipped = f"calibration {default} not applied: {why}"
        return inputs.model_copy(update={"calibration_skipped": skipped}), skipped
    return calibrated(inputs, cal, default), f"calibration '{cal.name}' applied ({default})"


def inputs_of_plan(plan: Plan) -> PlanInputs:
    """The inputs `plan` was made from, with the calibration its provenance names when that file still
    loads (grpo-run re-checks a calibrated plan with the constants it was planned with); else analytic."""
    inputs = plan_inputs(plan)
    path = plan.provenance.calibration_file
    if plan.provenance.calibration is None or path is None:
        return inputs
    if path.startswith(PACKAGED_PREFIX):
        packaged = packaged_for(plan.cluster.gpu.name)
        return calibrated(inputs, *packaged) if packaged else inputs
    try:
        return calibrated(inputs, load_calibration(path), path)
    except InputError:
        return inputs
