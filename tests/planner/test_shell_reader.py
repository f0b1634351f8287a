"""The bash reader behind --from-verl: what bash would make of a published launch script, nothing run."""

from __future__ import annotations

import pytest

from grpo_pilot.errors import InputError
from grpo_pilot.planner.from_verl import read_verl
from grpo_pilot.planner.shell_words import read_script, split_words

RAY_SUBMIT = """#!/bin/bash
MAX_PROMPT_LENGTH=1024
MAX_RESPONSE_LENGTH=3072
max_num_batched_tokens=$(expr $MAX_PROMPT_LENGTH + $MAX_RESPONSE_LENGTH + 1000)
ray job submit --address=${HEAD_IP}:${HEAD_PORT} \\
  --entrypoint-num-cpus=1 \\
  --runtime-env-json='{
        "working_dir": "'${WORKING_DIR}'",
        "env_vars": {
          "http_proxy": ""
        }
    }' \\
  -- python -m verl.trainer.main_ppo \\
  algorithm.adv_estimator=grpo \\
  actor_rollout_ref.rollout.max_num_batched_tokens=$max_num_batched_tokens \\
  data.max_response_length=$MAX_RESPONSE_LENGTH # a comment ' with a quote
echo "done"
"""


def test_quotes_carry_over_newlines_and_expr_is_evaluated() -> None:
    s = read_script(RAY_SUBMIT, {"WORKING_DIR": "/w"})
    submit = next(c for c in s.commands if c.words[0] == "ray")
    env_json = next(w for w in submit.words if w.startswith("--runtime-env-json="))
    assert env_json.count("\n") == 5 and '"working_dir": "/w"' in env_json  # bash joins the quoted lines
    assert "actor_rollout_ref.rollout.max_num_batched_tokens=5096" in submit.words
    assert submit.words[-1] == "data.max_response_length=3072"  # the comment (and its quote) is not a word
    assert s.commands[-1].words == ("echo", "done") and s.commands[-1].line == 17
    assert s.substitutions == ()  # $(expr ...) over integers is arithmetic, not a command to run


def test_substitutions_that_need_the_machine_are_reported() -> None:
    s = read_script("N=$(nproc)\nM=$(expr $N + 1)\nK=`hostname`\nE=$(echo a b)\n")
    assert s.variables["E"] == "a b"
    assert s.variables["N"] == "" and s.variables["M"] == ""  # expr over an empty value: not integer arithmetic
    assert set(s.substitutions) == {"$(nproc)", "$(expr $N + 1)", "`hostname`"}


def test_heredoc_bodies_are_not_commands() -> None:
    text = "cat > cfg.yaml <<EOF\nkey: 'open quote\nA=$(oops\nEOF\ncat <<-'END'\n\tB=1\n\tEND\nC=after\n"
    s = read_script(text)
    assert s.variables == {"C": "after"}
    assert [c.words for c in s.commands] == [("cat",), ("cat",)]


def test_argument_loop_sets_the_variables_from_script_args() -> None:
    text = """
TRAIN_BATCH_SIZE=256
MODEL_NAME=Qwen2.5-Math-7B
while [[ "$#" -gt 0 ]]; do
  case "$1" in
    --train_batch_size) TRAIN_BATCH_SIZE="$2"; shift 2 ;;
    --model_name)
        MODEL_NAME="$2"
        shift 2
        ;;
    --flag|-f) FLAG=1; shift ;;
    *) echo "Unknown option: $1"; exit 1 ;;
  esac
done
python -m verl.trainer.main_ppo data.train_batch_size=$TRAIN_BATCH_SIZE model=${MODEL_NAME}
"""
    s = read_script(text, args=["--model_name", "Qwen 7B", "-f", "--train_batch_size", "1024"])
    assert (s.variables["MODEL_NAME"], s.variables["TRAIN_BATCH_SIZE"], s.variables["FLAG"]) == ("Qwen 7B", "1024", "1")
    launch = s.commands[-1].words
    assert launch[3:] == ("data.train_batch_size=1024", "model=Qwen", "7B")  # unquoted: split at the blank
    rejected = read_script(text, args=["--bogus"])
    assert rejected.exit_line == 12 and not any("verl" in w for c in rejected.commands for w in c.words)
    assert read_script(text).variables["MODEL_NAME"] == "Qwen2.5-Math-7B"  # no arguments: the defaults


def test_positional_parameters_and_functions() -> None:
    text = """
MODEL=${1:-default/model}
N=${2:-8}
setup() { local inner="$1"; OUT="$inner:$#"; }
setup x y z
echo "$@" "${@:2}" $#
"""
    s = read_script(text, args=["m", "4", "extra"])
    assert (s.variables["MODEL"], s.variables["N"], s.variables["OUT"]) == ("m", "4", "x:3")
    assert "inner" not in s.variables  # local to the function
    assert s.commands[-1].words == ("echo", "m", "4", "extra", "4", "extra", "3")


def test_conditions_are_followed_where_they_can_be_known() -> None:
    text = """
if [ -z "$MODEL_PATH" ]; then MODEL_PATH=default; else MODEL_PATH=given; fi
[ "$ENGINE" = sglang ] && ROLL=sglang || ROLL=vllm
if [ -f /etc/some-file ]; then DATA=/a; else DATA=/b; fi
cd "$(dirname "$0")" || exit 1
FINAL=yes
"""
    s = read_script(text, {"ENGINE": "sglang"})
    assert (s.variables["MODEL_PATH"], s.variables["ROLL"]) == ("default", "sglang")
    assert s.variables["DATA"] == "/b" and any("line 4" in n for n in s.notes)  # both branches read, noted
    assert s.variables["FINAL"] == "yes" and s.exit_line is None  # `cd ... || exit 1`: cd taken to succeed


def test_arrays_arithmetic_and_trimming() -> None:
    text = 'ARGS=(a=1 "b=two words")\nARGS+=(c=3)\nX=$(( (7 > 2) ? 10 / 3 : -1 ))\nP=/x/y/Qwen2.5-7B\nN=${P##*/}\n'
    s = read_script(text + 'python -m verl.trainer.main_ppo "${ARGS[@]}" ${#ARGS[@]}\n')
    assert s.commands[-1].words[3:] == ("a=1", "b=two words", "c=3", "3")
    assert (s.variables["X"], s.variables["N"]) == ("3", "Qwen2.5-7B")
    assert read_script("A=$((9223372036854775807 + 1))").variables["A"] == "-9223372036854775808"  # 64-bit wrap


def test_script_args_flag_words() -> None:
    assert split_words("--model_name 'Qwen 2.5' --n \"8\" $HOME") == ["--model_name", "Qwen 2.5", "--n", "8", "$HOME"]
    with pytest.raises(InputError, match="shell syntax"):
        split_words("--a 1; rm -rf /")


def test_verl_reader_takes_script_args_and_passes_dollar_at() -> None:
    text = """
N=5
while [ $# -gt 0 ]; do case $1 in --n) N=$2; shift 2;; *) break;; esac; done
python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.model.path=m \\
  actor_rollout_ref.rollout.n=$N actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \\
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 "$@"
"""
    launch = read_verl(text, script_args=["--n", "16", "trainer.nnodes=2"])
    assert launch.workload["n"] == 16 and launch.num_nodes == 2  # the rest of "$@" reaches Hydra


def test_unterminated_quote_names_the_line() -> None:
    with pytest.raises(InputError, match="line 2"):
        read_script("A=1\nB='never closed\nC=3\n")
    with pytest.raises(InputError, match="never closed|no 'fi'"):
        read_script("if true; then A=1\n")
