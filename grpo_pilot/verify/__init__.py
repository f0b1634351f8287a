"""Checks of the planner's estimates that need torch: the traced method (byte-exact fake-tensor
accounting of an FSDP2 update step on CPU, `verify.traced.trace_update_step`) and its row-by-row
comparison with the analytic update phase (`verify.compare.compare_with_analytic`).

Kept outside `grpo_pilot.planner` so that planning never imports torch; the modules here import torch
inside their functions, so importing them is cheap too.
"""
