"""grpo-plan --from-verl / --from-trl against hostile launch files: one paragraph naming the problem, fast."""

from __future__ import annotations

import pytest
from hostile_helpers import assert_refused, invoke

from grpo_pilot.cli.plan import app

VERL_HEAD = (
    "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.model.path=qwen2.5-0.5b "
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 "
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 "
    "data.train_batch_size=16 actor_rollout_ref.actor.ppo_mini_batch_size=16 "
)


def _bomb(levels: int = 9, key: str = "per_device_train_batch_size") -> str:
    """The 'billion laughs' YAML: each level lists the previous one nine times (9**levels leaves when expanded)."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for k in range(1, levels + 1):
        lines.append(f"l{k}: &l{k} [" + ",".join([f"*l{k - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\nmodel_name_or_path: qwen2.5-0.5b\n{key}: *l{levels}\n"


def _short(result) -> None:
    assert len(result.output) < 4000, len(result.output)  # the value is shown bounded, never expanded


VERL_CASES = [
    ("doubling", "A=x\n" + "A=$A$A\n" * 40 + VERL_HEAD + "\n", "1 MiB"),
    ("micro-abc", VERL_HEAD.replace("ppo_micro_batch_size_per_gpu=2", "ppo_micro_batch_size_per_gpu=abc"), "ppo_micro"),
    (
        "budget-abc",
        VERL_HEAD
        + "actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=abc",
        "ppo_max_token_len_per_gpu",
    ),
    ("entropy-abc", VERL_HEAD + "actor_rollout_ref.actor.entropy_coeff=abc", "entropy_coeff"),
    ("entropy-inf", VERL_HEAD + "actor_rollout_ref.actor.entropy_coeff=inf", "entropy_coeff"),
    ("entropy-nan", VERL_HEAD + "actor_rollout_ref.actor.entropy_coeff=nan", "entropy_coeff"),
    ("flag-abc", VERL_HEAD + "actor_rollout_ref.model.enable_gradient_checkpointing=maybe", "gradient_checkpointing"),
    ("nested-expansion", "A=" + "${B:-" * 100_000 + "x" + "}" * 100_000 + "\n" + VERL_HEAD, "too deep"),
    ("nested-arith", "A=$((" + "(" * 100_000 + "1" + ")" * 100_000 + "))\n" + VERL_HEAD, "nests too deep"),
    ("recursion", "f() { f; }\nf\n" + VERL_HEAD, "calls itself"),
    (
        "many-big-words",
        "A=" + "x" * 900_000 + "\nfor i in $(seq 1 100) " + "1 " * 100 + "; do echo $A; done\n",
        "MiB of words",
    ),
    ("open-quote", VERL_HEAD + "data.x='never closed\n", "line 1"),
    ("pattern-on-huge", "A=" + "x" * 500_000 + "\nB=${A%%*y}\n" + VERL_HEAD, "pattern"),
]


@pytest.mark.parametrize("name,text,fragment", VERL_CASES, ids=[c[0] for c in VERL_CASES])
def test_hostile_verl_launch(scratch, tmp_path, name, text, fragment):
    script = tmp_path / "run.sh"
    script.write_text(text)
    scratch.mark()
    args = ["--from-verl", script, "--gpus", "H100", "--out", scratch.root / "plan.json"]
    result = invoke(app, args)
    assert_refused(result, 2, fragment)
    _short(result)
    scratch.check()


TRL_CASES = [
    ("alias-bomb", _bomb(), [], "per_device_train_batch_size"),
    (
        "alias-bomb-model",
        _bomb(key="model_name_or_path").replace("model_name_or_path: qwen2.5-0.5b\n", ""),
        [],
        "model",
    ),
    (
        "alias-bomb-override",
        "model_name_or_path: qwen2.5-0.5b\n",
        ["--override", "beta=" + _bomb().replace("\n", "\n")],
        "beta",
    ),
    ("beta-abc", "model_name_or_path: qwen2.5-0.5b\nbeta: abc\n", [], "beta"),
    ("beta-list", "model_name_or_path: qwen2.5-0.5b\nbeta: [1, 2]\n", [], "beta"),
    ("beta-inf", "model_name_or_path: qwen2.5-0.5b\nbeta: .inf\n", [], "beta"),
    ("nested", "a: " + "[" * 100_000 + "]" * 100_000 + "\n", [], "nests"),
    ("list-and-override", "- 1\n- 2\n", ["--override", "num_processes=1"], "not a mapping"),
    ("scalar", "just a string\n", [], "not a mapping"),
]


@pytest.mark.parametrize("name,text,extra,fragment", TRL_CASES, ids=[c[0] for c in TRL_CASES])
def test_hostile_trl_config(scratch, tmp_path, name, text, extra, fragment):
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text(text)
    scratch.mark()
    args = ["--from-trl", cfg, "--gpus", "1xH100", "--out", scratch.root / "plan.json", *extra]
    result = invoke(app, args)
    assert_refused(result, 2, fragment)
    _short(result)
    scratch.check()


def test_endless_loop_is_cut_not_hung(tmp_path):
    """`while true` with nothing that stops it: the loop is cut (noted) and the launch after it is read."""
    script = tmp_path / "run.sh"
    script.write_text("while true; do sleep 1; done &\n" + VERL_HEAD + "\n")
    result = invoke(app, ["--from-verl", script, "--gpus", "H100", "--json"])
    assert result.exit_code in (0, 3), result.output
