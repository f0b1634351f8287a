"""`Plan`: the frozen, versioned result of planning, stored as plan.json.

JSON contract (other tools read it): top level `schema_version, fits, knobs, peak_gpu_bytes,
usable_gpu_bytes, predicted_step_s, phases`; `phases` maps rollout, log_prob, update, weight_sync (and, for
a PPO plan, values and critic_update: `rules.PHASE_ORDER`) to `{"total_bytes": int, "items": {name:
bytes}}`; items named `overhead_*` are non-tensor overheads. Added without a version bump with the launch
families: `workload.algorithm`, `workload.critic` and the families' knobs (older plans load with their
defaults: GRPO, FSDP, no family knob set).
Added without a version bump (older plans load; their new fields are None): `headroom_bytes`,
`margin_bytes`, `memory_quantile`, `worst_case_peak_gpu_bytes`, `worst_case_phase`,
`worst_case_phases`, `peak_tensor_bytes` — the expected peak (at the memory quantile of the lengths) and the worst case
(every sequence at its maximum) with the margin left; `execution` — what the engine needs to run the
plan (`execution.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from grpo_pilot import __version__
from grpo_pilot.atomic import atomic_write_text
from grpo_pilot.errors import InputError
from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.inputs import JsonProblem, parse_json, read_json_file, validation_problem
from grpo_pilot.models import Frozen
from grpo_pilot.outputs import check_output_file
from grpo_pilot.planner.config import Knobs, Target, Workload
from grpo_pilot.planner.execution import Execution, execution_of
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS
from grpo_pilot.planner.reports import PhaseMemory
from grpo_pilot.planner.rules import PLAN_PHASES, PhaseName
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.profiles.spec import ModelSpec

SCHEMA_VERSION = 1
MAX_PLAN_BYTES = 16 << 20  # a plan.json is ~10 KiB


class ModelRef(Frozen):
    """The model as the user named it and as it resolved."""

    requested: str = Field(description="What the user typed (alias, hub id or path).")
    resolved: str = Field(description="Bundled config name or local path it resolved to.")
    hub_id: str | None = Field(default=None, description="Hub id of the bundled model, if any.")
    spec: ModelSpec


class Provenance(Frozen):
    """Where the numbers come from."""

    tool_version: str = __version__
    calibration: str | None = Field(
        default=None, description="Calibration profile applied to the coefficients (None = analytic defaults)."
    )
    calibration_file: str | None = Field(default=None, description="File the calibration was read from.")
    calibration_versions: dict[str, str | None] | None = Field(
        default=None, description="Software versions the calibration was measured with."
    )
    calibration_skipped: str | None = Field(
        default=None, description="A calibration file found but not applied, and why (other GPU or software)."
    )
    constant_sources: dict[str, str] | None = Field(
        default=None,
        description="Where each time constant and the CUDA context come from: measured (which calibration), "
        "scaled (a per-GPU table) or analytic (a documented default).",
    )
    search_trials: int = Field(default=0, ge=0, description="Optuna trials evaluated (0 = every knob pinned).")
    search_seed: int | None = Field(default=None, description="Sampler seed.")
    feasible_trials: int = Field(default=0, ge=0, description="Trials that satisfied every constraint.")
    refine_evaluations: int = Field(
        default=0, ge=0, description="Configurations the local refinement after the study assessed."
    )


VerdictKind = Literal["fits", "tight", "fits_below_mean_response", "fits_below_mean_lengths", "does_not_fit"]
# the verdicts `grpo-plan` ends with exit 4: a conditional fit (planner/verdict.py)
CONDITIONAL_VERDICTS: tuple[VerdictKind, ...] = ("tight", "fits_below_mean_response", "fits_below_mean_lengths")


class Verdict(Frozen):
    """How a plan fits (module docstring)."""

    kind: VerdictKind
    lengths_known: bool = Field(description="Whether the workload gives the data's lengths (else: the maxima).")
    boundary_mean_response_tokens: int | None = Field(
        default=None,
        description="Lengths unknown and the maxima do not fit: the largest mean response (tokens) that fits, with "
        "prompts at their maximum (fits_below_mean_response) or at `boundary_mean_prompt_tokens` "
        "(fits_below_mean_lengths).",
    )
    boundary_mean_prompt_tokens: int | None = Field(
        default=None,
        description="fits_below_mean_lengths: no mean response fits with prompts at their maximum; the mean prompt "
        "(tokens) of the largest fitting point, both means scaled down together (planner/verdict.py).",
    )
    peak_over_device_bytes: int = Field(description="Peak − device memory (negative: under the device).")
    message: str = Field(description="The verdict in one sentence.")


class Plan(Frozen):
    """A fully evaluated configuration: inputs, knobs, predicted memory and time, verdict."""

    schema_version: int = Field(default=SCHEMA_VERSION, description="plan.json schema; bumped on breaking changes.")
    fits: bool = Field(
        description="Every phase fits usable GPU memory, host RAM fits, and every divisibility rule holds."
    )
    knobs: Knobs
    peak_gpu_bytes: int = Field(
        ge=0,
        description="Largest phase total on one GPU: the device footprint (what nvidia-smi shows): tensors, the "
        "caching allocator's reserve beyond them, CUDA context, cuBLAS and NCCL buffers.",
    )
    peak_tensor_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Largest phase's tensor bytes (its items without overhead_*): what torch.cuda.max_memory_allocated "
        "shows; plans written before it was recorded get it from their phases on load.",
    )
    usable_gpu_bytes: int = Field(gt=0, description="Device memory minus the safety headroom.")
    predicted_step_s: float = Field(ge=0.0, description="Roofline seconds per GRPO step.")
    phases: dict[PhaseName, PhaseMemory]
    phase_times_s: dict[PhaseName, float] = Field(description="Predicted seconds by phase.")
    tokens_per_s: float = Field(ge=0.0, description="Predicted trained tokens per second (cluster).")
    mfu: float = Field(ge=0.0, description="Predicted model FLOPs utilisation.")
    host: PhaseMemory = Field(description="Host RAM per node, itemised.")
    host_ram_bytes_per_node: int = Field(gt=0, description="Host RAM available per node.")
    kv_cache_tokens_per_gpu: int = Field(ge=0)
    max_concurrent_seqs: int = Field(ge=0)
    binding_constraint: str | None = Field(
        default=None, description="'phase.item' (or rule) that limits the plan; None if nothing binds."
    )
    violations: tuple[str, ...] = Field(default=(), description="Every constraint this plan breaks (empty when fits).")
    suggestions: tuple[str, ...] = Field(default=(), description="What would make it fit, computed by the estimator.")
    model: ModelRef
    cluster: Cluster
    workload: Workload
    target: Target = Field(default="grpo-pilot", description="Executor whose choices the estimate models.")
    provenance: Provenance = Field(default_factory=Provenance)
    headroom_bytes: int | None = Field(default=None, ge=0, description="Device memory kept free (the safety margin).")
    margin_bytes: int | None = Field(
        default=None, description="Usable memory left at the expected peak (negative when it does not fit)."
    )
    memory_quantile: float | None = Field(
        default=None,
        description="Quantile of the micro-batch token count the expected peak is judged at (None: every "
        "sequence at its maximum, so the expected peak is the worst case).",
    )
    worst_case_peak_gpu_bytes: int | None = Field(
        default=None, ge=0, description="Largest phase total with every prompt and response at its maximum."
    )
    worst_case_phase: PhaseName | None = Field(default=None, description="The phase that peaks in the worst case.")
    worst_case_phases: dict[PhaseName, int] | None = Field(
        default=None, description="Phase totals in the worst case, bytes."
    )
    verdict: Verdict | None = Field(
        default=None, description="How the plan fits: fits, tight, fits below a length boundary, does not fit."
    )
    execution: Execution | None = Field(
        default=None,
        description="What the engine needs to run the plan (layout, rollout KV bytes per token, weight-sync "
        "bucket, old-policy pass); plans written before it was recorded get it from their inputs on load.",
    )

    @model_validator(mode="after")
    def _every_phase(self) -> "Plan":
        for name, table in (("phases", self.phases), ("phase_times_s", self.phase_times_s)):
            missing = [p for p in PLAN_PHASES if p not in table]
            if missing:
                raise ValueError(f"{name} lacks {', '.join(missing)} (a plan has all of {', '.join(PLAN_PHASES)})")
        return self

    @model_validator(mode="after")
    def _execution(self) -> "Plan":
        if self.peak_tensor_bytes is None:  # an older plan file
            object.__setattr__(
                self, "peak_tensor_bytes", max((p.tensor_bytes for p in self.phases.values()), default=0)
            )
        if self.execution is None:  # an older plan file: derive it (analytic constants)
            facts = execution_of(
                self.model.spec,
                self.cluster,
                self.workload,
                self.knobs,
                executor=traits_for(self.target),
                overheads=DEFAULT_OVERHEADS,
            )
            object.__setattr__(self, "execution", facts)
        return self

    @property
    def run(self) -> Execution:
        """The engine's numbers (always present after validation)."""
        assert self.execution is not None
        return self.execution

    @property
    def worst_case_fits(self) -> bool | None:
        """Whether the worst case stays within usable memory (None for plans written before it was recorded)."""
        if self.worst_case_peak_gpu_bytes is None:
            return None
        return self.worst_case_peak_gpu_bytes <= self.usable_gpu_bytes

    def to_json(self) -> str:
        return self.model_dump_json(indent=2) + "\n"


def is_plan_file(path: str | Path) -> bool:
    """Whether `path` holds a plan.json (a JSON object with schema_version and knobs): what `--out` may replace."""

    try:
        with open(path, "rb") as handle:
            raw = parse_json(handle.read(MAX_PLAN_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError, JsonProblem):
        return False
    return isinstance(raw, dict) and "schema_version" in raw and "knobs" in raw


def check_plan_out(path: str | Path, flag: str = "--out") -> Path:
    """Where a plan may be written: absent, or a regular file holding an earlier plan (outputs.py)."""
    return check_output_file(path, flag=flag, what="plan file", ours=is_plan_file)


def save_plan(plan: Plan, path: str | Path) -> Path:
    """Write plan.json atomically (temp file + rename); only over nothing or an earlier plan file."""
    return atomic_write_text(check_plan_out(path), plan.to_json())


def load_plan(path: str | Path) -> Plan:
    """Read plan.json; corrupt, foreign or newer files raise `InputError` with what to do."""
    p = Path(path)
    redo = "Re-create it with `grpo-plan ... --out plan.json`."
    raw = read_json_file(p, "plan file", hint=redo, max_bytes=MAX_PLAN_BYTES)
    if not isinstance(raw, dict) or "schema_version" not in raw or "knobs" not in raw:
        raise InputError(f"'{p}' is not a grpo-pilot plan (no schema_version/knobs).", redo)
    if raw["schema_version"] != SCHEMA_VERSION:
        raise InputError(
            f"'{p}' has plan schema_version {raw['schema_version']!r}; this grpo-pilot reads version {SCHEMA_VERSION}.",
            redo,
        )
    try:
        return Plan.model_validate(raw)
    except ValidationError as exc:
        raise InputError(f"'{p}' is a damaged plan: {validation_problem(exc)}.", redo) from None
