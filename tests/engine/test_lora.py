"""LoRA / DoRA on the actor (engine/lora.py): trainable adapters only, the base as reference, merged weights for a
rollout engine, adapter-only checkpoints, the refusals, and QLoRA's configuration (engine/qlora.py, with stand-ins:
bitsandbytes needs CUDA)."""

from __future__ import annotations

import copy

import pytest
import torch
from test_actor import make_samples, reference_logprobs

from grpo_pilot.engine import qlora
from grpo_pilot.engine.actor import Actor, LossSettings
from grpo_pilot.engine.lora import check_adapter_run, lora_config, merged_weights
from grpo_pilot.engine.model_factory import build_model
from grpo_pilot.engine.rollout.llama_step import unsupported_reason
from grpo_pilot.engine.settings import ActorSettings
from grpo_pilot.engine.weight_sync import full_weights, policy_weights
from grpo_pilot.errors import InputError
from grpo_pilot.planner.adapters import AdapterSettings, flag_adapter

torch.set_num_threads(1)
TINY = "examples/tiny"
LORA = flag_adapter(4, alpha=8.0)
DORA = LORA.model_copy(update={"method": "dora", "rslora": True})


def lora_actor(adapter: AdapterSettings = LORA, **settings) -> tuple[Actor, torch.nn.Module]:
    """An actor with adapters on the tiny model, and an untouched copy of its base."""
    base = build_model(TINY, seed=0)
    plain = copy.deepcopy(base)
    options = dict(lr=1e-2, max_grad_norm=1e9, with_ref=True, adapter=adapter) | settings
    return Actor(base, device=torch.device("cpu"), settings=ActorSettings(**options)), plain


def train(actor: Actor, steps: int = 3) -> None:
    samples = make_samples()
    ref = actor.log_probs(samples, ref=True)
    for _ in range(steps):
        actor.update(samples, torch.linspace(-1.0, 1.0, len(samples)), LossSettings(kl_coef=0.1), ref_logprobs=ref)


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def test_only_adapter_parameters_train_and_reach_the_optimizer():
    actor, _ = lora_actor()
    trainable = {n for n, p in actor.policy.named_parameters() if p.requires_grad}
    # all-linear on 2 layers: q, k, v, o, gate, up, down, each with lora_A and lora_B
    assert len(trainable) == 2 * 7 * 2 and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    in_optimizer = {id(p) for group in actor.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in actor.policy.parameters() if p.requires_grad}
    # r (in + out) per adapted linear: q, k, v, o are 64 -> 64, gate / up 64 -> 256, down 256 -> 64
    assert sum(p.numel() for p in actor.trainable_parameters()) == 2 * 4 * (4 * 128 + 3 * 320)
    assert actor.ref is None  # no second copy of the weights


def test_reference_is_the_base_and_the_policy_moves_away_from_it():
    actor, plain = lora_actor()
    samples = make_samples()
    base = [reference_logprobs(plain, s) for s in samples]
    assert max_diff(actor.log_probs(samples), base) < 1e-5  # B = 0 at init: the policy starts as the base
    train(actor)
    assert max_diff(actor.log_probs(samples, ref=True), base) < 1e-5  # adapters off = the base, after updates
    assert max_diff(actor.log_probs(samples), base) > 1e-2
    frozen = {n.replace(".base_layer", ""): p for n, p in actor.policy.named_parameters() if not p.requires_grad}
    assert all(torch.equal(frozen[n], p) for n, p in plain.named_parameters())  # the base never changed


@pytest.mark.parametrize("adapter", [LORA, DORA], ids=["lora", "dora"])
def test_merged_weights_reproduce_the_adapted_policy_without_touching_it(adapter):
    actor, plain = lora_actor(adapter)
    train(actor)
    before = {n: p.detach().clone() for n, p in actor.policy.named_parameters()}
    merged = dict(policy_weights(actor.policy))
    assert all(torch.equal(before[n], p) for n, p in actor.policy.named_parameters())  # nothing written
    assert set(merged) == {n for n, _ in full_weights(plain)}  # the plain model's names, tied ones included
    served = copy.deepcopy(plain)
    with torch.no_grad():
        for name, param in served.named_parameters(remove_duplicate=False):
            param.copy_(merged[name])
    samples = make_samples()
    assert max_diff([reference_logprobs(served, s) for s in samples], actor.log_probs(samples)) < 1e-4
    assert max_diff([reference_logprobs(plain, s) for s in samples], actor.log_probs(samples)) > 1e-2


def test_merged_weight_is_base_plus_scaled_product():
    actor, _ = lora_actor(LORA.model_copy(update={"target_modules": ("q_proj",)}))
    layer = actor.policy.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
    merged = dict(merged_weights(actor.policy))["model.layers.0.self_attn.q_proj.weight"]
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    torch.testing.assert_close(merged, layer.base_layer.weight + (8.0 / 4) * (b @ a))  # alpha / r


def test_checkpoint_holds_the_adapters_and_their_optimizer_states_and_restores_them():
    actor, _ = lora_actor()
    train(actor)
    state = actor.state_dict()
    names = {n for n, p in actor.policy.named_parameters() if p.requires_grad}
    assert set(state["model"]) == names  # no base weight, not even the tied LM head
    assert len(state["optimizer"]["state"]) == len(names)
    saved = copy.deepcopy(state)
    samples = make_samples()
    want = actor.log_probs(samples)

    other, _ = lora_actor()  # same base (seed), fresh adapters
    assert max_diff(other.log_probs(samples), want) > 1e-2
    other.load_state_dict(saved["model"], saved["optimizer"])
    assert max_diff(other.log_probs(samples), want) == 0.0
    train(actor, 1)
    train(other, 1)  # the restored AdamW moments give the same next step
    assert max_diff(other.log_probs(samples), actor.log_probs(samples)) < 1e-6


def test_fast_decode_step_is_off_for_adapted_models_and_module_callers_keep_them():
    actor, plain = lora_actor()
    assert unsupported_reason(plain) is None
    assert "adapter" in unsupported_reason(actor.policy)
    assert unsupported_reason(actor.policy, allow_adapters=True) is None


def test_lora_config_follows_the_settings_and_peft_defaults():
    cfg = lora_config(flag_adapter(16, alpha=32.0, targets="q_proj,v_proj"))
    assert (cfg.r, cfg.lora_alpha, set(cfg.target_modules), cfg.use_dora) == (16, 32.0, {"q_proj", "v_proj"}, False)
    assert lora_config(LORA).target_modules == "all-linear"
    unset = lora_config(AdapterSettings(framework="trl", method="dora", rank=8))
    assert unset.lora_alpha == 8 and unset.target_modules is None and unset.use_dora  # peft's own defaults


def test_targets_the_model_does_not_have_are_refused():
    with pytest.raises(InputError, match="not_a_module") as refused:
        lora_actor(flag_adapter(4, targets="not_a_module"))
    assert "--lora-targets" in refused.value.hint


@pytest.mark.parametrize(
    ("adapter", "kw", "match"),
    [
        (flag_adapter(8, base_bits="4bit"), {}, "CPU"),
        (flag_adapter(8, targets="q_proj,lm_head"), {}, "output head"),
        (LORA.model_copy(update={"modules_to_save": ("lm_head",)}), {}, "modules_to_save"),
        (LORA.model_copy(update={"method": "none", "base_quantization": "4bit"}), {}, "no adapters"),
    ],
)
def test_what_the_engine_cannot_run_is_refused(adapter, kw, match):
    args = dict(device_type="cpu", train_world=1, offload=False, shares_policy=True) | kw
    with pytest.raises(InputError, match=match):
        check_adapter_run(adapter, **args)


def test_qlora_refusals_on_cuda(monkeypatch):
    four = flag_adapter(8, base_bits="4bit")
    cuda = dict(device_type="cuda", train_world=1, offload=False, shares_policy=True)
    monkeypatch.setattr(qlora.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(InputError, match="bitsandbytes is not installed"):
        check_adapter_run(four, **cuda)
    monkeypatch.setattr(qlora.importlib.util, "find_spec", lambda name: object())
    check_adapter_run(four, **cuda)  # one GPU, hf rollout on the trainer: accepted
    with pytest.raises(InputError, match="FSDP2 cannot shard"):
        check_adapter_run(four, **(cuda | {"train_world": 2}))
    with pytest.raises(InputError, match="FSDP2 cannot shard"):
        check_adapter_run(four, **(cuda | {"offload": True}))
    with pytest.raises(InputError, match="merged"):
        check_adapter_run(four, **(cuda | {"shares_policy": False}))


def test_quantization_config_is_the_qlora_recipe():
    four = qlora.quantization_config(flag_adapter(8, base_bits="4bit"))
    assert four.load_in_4bit and not four.load_in_8bit
    assert (four.bnb_4bit_quant_type, four.bnb_4bit_use_double_quant) == ("nf4", True)
    assert four.bnb_4bit_compute_dtype == torch.bfloat16
    fp4 = flag_adapter(8, base_bits="4bit").model_copy(update={"quant_type": "fp4", "double_quant": False})
    assert qlora.quantization_config(fp4).bnb_4bit_quant_type == "fp4"
    eight = qlora.quantization_config(flag_adapter(8, base_bits="8bit"))
    assert eight.load_in_8bit and not eight.load_in_4bit


def test_load_quantized_loads_with_the_config_and_prepares_for_kbit_training(monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM

    calls: dict = {}

    class Loader:
        from_config = AutoModelForCausalLM.from_config  # build_model's random init, as it is

        @staticmethod
        def from_pretrained(path, **kwargs):
            calls["path"], calls["kwargs"] = path, kwargs
            calls["saved"] = sorted(p.name for p in __import__("pathlib").Path(path).iterdir())
            return "quantized-model"

    def prepare(model, **kwargs):
        calls["prepared"] = (model, kwargs)
        return model

    monkeypatch.setattr("transformers.AutoModelForCausalLM", Loader)
    monkeypatch.setattr("peft.prepare_model_for_kbit_training", prepare)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    out = qlora.load_quantized(TINY, flag_adapter(8, base_bits="4bit"), seed=0, vocab_size=None,
                               gradient_checkpointing=True)  # fmt: skip
    assert out == "quantized-model"
    assert calls["kwargs"]["quantization_config"].load_in_4bit
    assert calls["kwargs"]["device_map"] == {"": 0} and calls["kwargs"]["dtype"] is torch.bfloat16
    assert "grpo-pilot-qlora-" in str(calls["path"])  # no weights on disk: the random init went through a temp dir
    assert "model.safetensors" in calls["saved"] and "config.json" in calls["saved"]
    model, kwargs = calls["prepared"]
    assert model == "quantized-model" and kwargs["use_gradient_checkpointing"] is True
    assert kwargs["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
