"""grpo-pilot: plan, run and profile GRPO fine-tuning.

`import grpo_pilot.planner` needs no torch; the engine imports torch, vLLM and Ray lazily.
"""

__version__ = "0.1.0"
