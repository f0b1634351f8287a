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
"""
