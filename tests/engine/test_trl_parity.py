"""Parity with TRL's GRPO loss: same tiny Qwen2 model, same fixed batch, `GRPOTrainer._compute_loss`
vs our log-probs + `policy_loss`; the loss and every parameter gradient must agree in float32.

Name map (reference/grpo.md): loss_type grpo -> seq-mean-token-mean, bnpo -> token-mean (local token
count), dr_grpo -> seq-mean-token-sum-norm with L = max_completion_length, dapo -> token-mean with the
batch token count (`num_items_in_batch`) as global_num_tokens; epsilon/epsilon_high -> clip_low/high;
beta -> kl_coef with k3; importance_sampling_level="sequence" -> ratio_level="sequence";
entropy_coef -> entropy_coeff (TRL uses the token mean, so only bnpo/dapo match ours for that term).
TRL is run with bf16=False, use_bias_correction_kl=False, no vLLM, one accumulation step.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

from grpo_pilot.engine import compute_advantages, policy_loss  # noqa: E402
from grpo_pilot.engine.algos import (
    TRL_LOSS_TYPE_TO_AGG_MODE,
    chunked_token_logprobs,
    entropy_from_logits,
    token_logprobs,
)  # noqa: E402

PROMPT_LEN, COMPLETION_LEN, MAX_COMPLETION_LEN = 3, 6, 8
COMPLETION_LENGTHS = [6, 3, 5, 1]  # ragged
NUM_GENERATIONS = 2
TEMPERATURE = 0.7
EPS_LOW, EPS_HIGH = 0.2, 0.28


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_pilot.engine.model_factory import build_char_tokenizer, save_model_dir

    tok = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return save_model_dir(Qwen2ForCausalLM(config), tok, tmp_path_factory.mktemp("tiny-qwen2"))


def _trainer(model_dir, loss_type: str, beta: float, **extra):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from grpo_pilot.engine.model_factory import build_char_tokenizer

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32
    )  # ref model loads from the same dir
    args = GRPOConfig(
        output_dir=str(model_dir / "trl-out"),
        bf16=False,
        report_to=[],
        use_vllm=False,
        use_cpu=True,
        beta=beta,
        loss_type=loss_type,
        epsilon=EPS_LOW,
        epsilon_high=EPS_HIGH,
        temperature=TEMPERATURE,
        num_generations=NUM_GENERATIONS,
        per_device_train_batch_size=4,
        max_completion_length=MAX_COMPLETION_LEN,
        use_bias_correction_kl=False,
        disable_dropout=True,
        save_strategy="no",
        **extra,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["ab"] * 4}),
        processing_class=build_char_tokenizer(),
    )
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    return trainer


def _batch(model, vocab_size: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    num = len(COMPLETION_LENGTHS)
    prompt_ids = torch.randint(3, vocab_size, (num, PROMPT_LEN), generator=gen)
    completion_ids = torch.randint(3, vocab_size, (num, COMPLETION_LEN), generator=gen)
    mask = (torch.arange(COMPLETION_LEN).unsqueeze(0) < torch.tensor(COMPLETION_LENGTHS).unsqueeze(1)).long()
    with torch.no_grad():
        current = _our_logprobs(model, prompt_ids, completion_ids, mask)[0]
    rewards = torch.tensor([1.0, 0.0, 0.2, 0.9])
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": mask,
        "advantages": compute_advantages(rewards, NUM_GENERATIONS, eps=1e-4),
        # off-policy old log-probs: ratios spread over ~[0.6, 1.6] so that both clip sides are hit
        "old_per_token_logps": current + 0.25 * torch.randn(current.shape, generator=gen),
        "ref_per_token_logps": current + 0.3 * torch.randn(current.shape, generator=gen),
        "num_items_in_batch": mask.sum(),
    }


def _our_logprobs(model, prompt_ids, completion_ids, mask, chunked: bool = False):
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention = torch.cat([torch.ones_like(prompt_ids), mask], dim=1)
    if chunked:
        hidden = model.model(input_ids=input_ids, attention_mask=attention).last_hidden_state[:, PROMPT_LEN - 1 : -1]
        flat_lp, flat_h = chunked_token_logprobs(
            hidden.reshape(-1, hidden.shape[-1]),
            model.lm_head.weight,
            completion_ids.reshape(-1),
            temperature=TEMPERATURE,
            chunk_tokens=5,
            with_entropy=True,
        )
        return flat_lp.view_as(completion_ids.float()), flat_h.view_as(completion_ids.float())
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, PROMPT_LEN - 1 : -1]
    return token_logprobs(logits, completion_ids, temperature=TEMPERATURE), entropy_from_logits(
        logits, temperature=TEMPERATURE
    )


def _grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


CASES = [(loss_type, beta, {}, {}) for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo") for beta in (0.0, 0.04)]
CASES += [
    ("grpo", 0.0, {"importance_sampling_level": "sequence"}, {"ratio_level": "sequence"}),  # GSPO
    ("bnpo", 0.0, {"entropy_coef": 0.05}, {"entropy_coeff": 0.05}),
    ("dapo", 0.04, {}, {"chunked": True}),
]


@pytest.mark.parametrize(
    ("loss_type", "beta", "trl_extra", "ours_extra"),
    CASES,
    ids=[f"{c[0]}-beta{c[1]}{'-' + '-'.join(c[3]) if c[3] else ''}" for c in CASES],
)
def test_loss_and_gradients_match_trl(model_dir, loss_type, beta, trl_extra, ours_extra):
    trainer = _trainer(model_dir, loss_type, beta, **trl_extra)
    model = trainer.model
    batch = _batch(model, model.config.vocab_size)

    model.zero_grad()
    trl_loss = trainer._compute_loss(model, dict(batch))
    trl_loss.backward()
    trl_grads = _grads(model)

    ours_extra = dict(ours_extra)
    chunked = ours_extra.pop("chunked", False)
    model.zero_grad()
    mask = batch["completion_mask"]
    logprobs, entropy = _our_logprobs(model, batch["prompt_ids"], batch["completion_ids"], mask, chunked=chunked)
    loss, metrics = policy_loss(
        logprobs,
        batch["old_per_token_logps"],
        batch["advantages"],
        mask,
        loss_agg_mode=TRL_LOSS_TYPE_TO_AGG_MODE[loss_type],
        clip_low=EPS_LOW,
        clip_high=EPS_HIGH,
        ref_logprobs=batch["ref_per_token_logps"] if beta else None,
        kl_coef=beta,
        kl_type="k3",
        entropy=entropy,
        loss_scale_len=MAX_COMPLETION_LEN if loss_type == "dr_grpo" else None,
        global_num_tokens=batch["num_items_in_batch"] if loss_type == "dapo" else None,
        log_ratio_clamp=None,
        **ours_extra,
    )
    loss.backward()
    our_grads = _grads(model)

    assert 0.0 < metrics["clipfrac"] < 1.0  # the batch exercises clipped and unclipped tokens
    torch.testing.assert_close(loss.detach(), trl_loss.detach(), rtol=1e-5, atol=1e-6)
    assert set(our_grads) == set(trl_grads) and len(our_grads) == len(list(model.parameters()))
    for name, grad in trl_grads.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(our_grads[name], grad, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
