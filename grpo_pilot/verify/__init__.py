"""Checks of the planner's estimates that need torch: the traced method (byte-exact fake-tensor
accounting of the engine's own actor — FSDP2, GRPO loss, AdamW — on CPU, `verify.traced.trace_actor_step`)
and its row-by-row comparison with the analytic update and log-prob phases
(`verify.compare.compare_with_analytic`, `verify.compare.verify_plan`: `grpo-plan --verify`).

Kept outside `grpo_pilot.planner` so that planning never imports torch; the modules here import torch
inside their functions, so importing them is cheap too.
"""
