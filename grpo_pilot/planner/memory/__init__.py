"""Memory leaves: one small module per memory item or technique (pure functions of plain values).

Modules (each returns integer bytes; the orchestrator `planner/estimate.py` combines them per phase):
- `precision`      — bytes per element of each tensor family per executor (grpo-pilot, verl, trl) and device.
- `layout`         — which GPUs train and which roll out (colocated vs split); the FSDP degree D.
- `tokens`         — tokens per rank of an update / log-prob micro-batch (dynamic vs fixed, Ulysses).
- `model_states`   — sharded master params, grads, Adam states, reference params (ZeRO-3 / FSDP).
- `fsdp`           — all-gathered decoder layer(s), root-held embeddings / lm_head, unsharded grads and
                     reduce-scatter buffers.
- `activations`    — per-token per-layer activation bytes, attention masks, with and without checkpointing.
- `logits`         — log-prob / entropy logits temporaries (HF-style, flash-attn CE, fused/chunked).
- `moments`        — which transients coexist: the update's and the log-prob pass's peak moments.
- `optimizer`      — AdamW step temporaries.
- `ulysses`        — sequence-parallel all-to-all buffers.
- `kv_cache`       — KV bytes per token, tokens and concurrent sequences.
- `vllm_budget`    — the vLLM engine's gpu_memory_utilization budget split (weights, activations,
                     non-torch buffers, CUDA graphs, KV cache).
- `hf_generate`    — rollout with transformers `generate` on the policy itself.
- `weight_sync`    — largest gathered tensor and the transfer bucket.
- `host`           — host RAM per node.

Launch families (issue 14; not yet wired into `estimate.py`, see docs/families.md):
- `shape`          — `TransformerShape`, the architecture numbers the family leaves share.
- `megatron`       — Megatron-Core per-rank states (TP×PP×EP, distributed optimizer) and verl's offload.
- `megatron_activations` — per-stage activations (1F1B / VPP in flight, SP, CP, recompute), logits.
- `lora`           — adapters, frozen (quantized) base, activation delta, dequantization, reference.
- `lora_rollout`   — vLLM LoRA slots and verl's adapter sync.
- `sglang_budget`  — SGLang's mem_fraction_static budget (a fraction of the free memory).
- `activation_offload` — verl's activation offload to pinned host memory.
- `critic`         — PPO critic, GAE host buffers, reward model.
"""
