"""CUDA's autocast cast policy on cpu tensors: what `torch.autocast("cuda", bfloat16)` does to each op,
applied by `torch.autocast("cpu", bfloat16)` inside `cuda_autocast_policy()`.

Why: the traced method runs the engine's actor on fake `cpu` tensors (fake `cuda` tensors cannot run
backward on a CPU-only torch build, reference/memory-model.md §7), but one unsharded training rank runs its
fp32 weights under CUDA autocast (engine/actor.py `ScoredLogProbs._autocast`), whose per-op cast
policy differs from cpu autocast's: on CUDA `softmax`, `log_softmax`, `sum`, `cumsum`, `exp`, `pow`,
`rsqrt`, `logsumexp`, ... run in float32 and `einsum`, `addmv`, ... in bfloat16; on cpu they do not
(and cpu runs `cat`, `stack`, `prod`, ... under policies CUDA does not have). The two lists are read
from the dispatcher (`_dispatch_get_registrations_for_dispatch_key`) and from torch's own header
(torch/include/ATen/autocast_mode.h, torch 2.13: `AT_FORALL_LOWER_PRECISION_FP`, `AT_FORALL_FP32`,
`AT_FORALL_FP32_SET_OPT_DTYPE`, `AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE`, `AT_FORALL_PROMOTE`, plus
the .cpp's `cudnn_convolution[_transpose]` lower-precision and banned `binary_cross_entropy`).

How (faithful by construction, for every op on either list):
- an op on both lists with the lower-precision policy on both (the matmul family and SDPA, checked at
  entry) keeps cpu autocast's own C++ kernel: the same `cached_cast(lower_precision_fp, args, device)`
  as CUDA's, including the weight-cast cache (aten/src/ATen/autocast_mode.cpp: a float32 leaf that
  requires grad, not a view, cached until the outermost autocast region exits; not cached under
  inference mode, pytorch#158232);
- every other op on CUDA's list gets a Python kernel at the `AutocastCPU` key that applies CUDA's
  policy (fp32: cast every eligible floating tensor argument to float32; fp32_set_opt_dtype: an unset
  `dtype` becomes float32 when the first argument is eligible; fp32_append_dtype: `norm` redispatched
  with a float32 dtype; promote: every eligible argument cast to the widest among them; lower
  precision: cast to bfloat16) and redispatches below autocast, so autograd records the casts as on
  CUDA (autocast sits above autograd in the dispatch order);
- an op on cpu's list only falls through (CUDA autocast leaves it alone).
Eligible, as `is_autocast_eligible` / `is_eligible` say: a defined floating tensor, not float64, on the
autocast's device (here cpu). The Python lower-precision kernels do not cache: an op other than the
matmul family that receives a cacheable weight raises (no decoder the trace builds does that).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from grpo_pilot.errors import RunError

# torch/include/ATen/autocast_mode.h (torch 2.13) and aten/src/ATen/autocast_mode.cpp, by cast policy.
LOWER_PRECISION_OPS = (
    "_convolution.deprecated",
    "_convolution",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linalg_vecdot",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention",
    "cudnn_convolution",
    "cudnn_convolution_transpose",
)
FP32_OPS = (
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "rms_norm",
    "group_norm",
    "frobenius_norm.dim",
    "nuclear_norm",
    "nuclear_norm.dim",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "upsample_nearest1d",
    "_upsample_nearest_exact1d",
    "upsample_nearest2d",
    "_upsample_nearest_exact2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "_upsample_bilinear2d_aa",
    "upsample_trilinear3d",
    "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
)
FP32_SET_OPT_DTYPE_OPS = (
    "prod",
    "prod.dim_int",
    "softmax.int",
    "log_softmax.int",
    "cumprod",
    "cumsum",
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "linalg_matrix_norm.str_ord",
    "sum",
    "sum.dim_IntList",
)
# fp32_append_dtype: the op and the dtype-taking overload it redispatches to
FP32_APPEND_DTYPE_OPS = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}
PROMOTE_OPS = (
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "vdot",
    "grid_sampler",
    "index_put",
    "tensordot",
    "scatter_add",
)
BANNED_OPS = ("binary_cross_entropy",)
# Lower precision on cpu and CUDA alike: cpu autocast's C++ kernel stays (probed at entry, `_probe_kept`).
KEPT_CPU_KERNELS = ("linear", "matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "scaled_dot_product_attention")
_CASTABLE_TYPES = ("Tensor", "Optional[Tensor]", "List[Tensor]")  # str(schema type); not List[Optional[Tensor]]


def cuda_policy_ops() -> set[str]:
    """Every op CUDA autocast registers, as `name[.overload]` (the tables above)."""
    return (
        set(LOWER_PRECISION_OPS)
        | set(FP32_OPS)
        | set(FP32_SET_OPT_DTYPE_OPS)
        | set(FP32_APPEND_DTYPE_OPS)
        | set(PROMOTE_OPS)
        | set(BANNED_OPS)
    )


def _registered(key: str) -> set[str]:
    import torch

    return {name.removeprefix("aten::") for name in torch._C._dispatch_get_registrations_for_dispatch_key(key)}


def _overload(name: str) -> Any:
    import torch

    op_name, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, op_name), overload or "default")


def _eligible(t: Any) -> bool:
    import torch

    return isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.is_floating_point() and t.dtype != torch.float64


def _cast_value(value: Any, kind: str, dtype: Any) -> Any:
    if kind == "List[Tensor]" and isinstance(value, (list, tuple)):
        return [v.to(dtype) if _eligible(v) and v.dtype != dtype else v for v in value]
    if _eligible(value) and value.dtype != dtype:
        return value.to(dtype)
    return value


def _map_args(op: Any, args: tuple, kwargs: dict, fn: Any) -> tuple[list, dict]:
    """Apply fn(value, schema type) to every argument of `op`, positional or keyword."""
    schema_args = op._schema.arguments
    new_args = [fn(value, str(schema_args[i].type)) for i, value in enumerate(args)]
    types = {a.name: str(a.type) for a in schema_args}
    return new_args, {k: fn(v, types.get(k, "")) for k, v in kwargs.items()}


def _tensors(values: Any) -> Iterator[Any]:
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from (t for t in v if _eligible(t))
        elif _eligible(v):
            yield v


def _below_autocast(op: Any, args: Any, kwargs: Any) -> Any:
    import torch

    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    with torch._C._ExcludeDispatchKeyGuard(keys):
        return op(*args, **kwargs)


def _cast_kernel(op: Any, to_dtype: Any) -> Any:
    """fp32 / lower-precision policy: every castable eligible argument to `to_dtype`."""
    import torch

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if to_dtype != torch.float32:  # the C++ cache would keep a weight's cast; these kernels do not
            for t in _tensors([*args, *kwargs.values()]):
                if t.dtype == torch.float32 and t.requires_grad and t.is_leaf and not t._is_view():
                    raise RunError(
                        f"The CUDA autocast emulation has no weight-cast cache for aten::{op._schema.name}.",
                        "Trace a model whose weights only meet the matmul family (linear, matmul, mm, bmm).",
                    )
        new_args, new_kwargs = _map_args(
            op, args, kwargs, lambda v, kind: _cast_value(v, kind, to_dtype) if kind in _CASTABLE_TYPES else v
        )
        return _below_autocast(op, new_args, new_kwargs)

    return kernel


def _set_opt_dtype_kernel(op: Any) -> Any:
    import torch

    names = [a.name for a in op._schema.arguments]
    where = names.index("dtype")

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if args and _eligible(args[0]):
            if len(args) > where:
                if args[where] is None:
                    args = (*args[:where], torch.float32, *args[where + 1 :])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        return _below_autocast(op, args, kwargs)

    return kernel


def _append_dtype_kernel(op: Any, target: Any) -> Any:
    import torch

    def kernel(*args: Any, **kwargs: Any) -> Any:
        first = args[0]
        dtype = torch.float32 if _eligible(first) else first.dtype
        p = args[1] if len(args) > 1 else kwargs.get("p", 2)
        if op._schema.overload_name == "Scalar":  # norm(self, p=2) -> norm(self, p, *, dtype)
            return _below_autocast(target, (first, p), {"dtype": dtype})
        dim = args[2] if len(args) > 2 else kwargs["dim"]
        keepdim = args[3] if len(args) > 3 else kwargs.get("keepdim", False)
        return _below_autocast(target, (first, p, dim, keepdim), {"dtype": dtype})

    return kernel


def _promote_kernel(op: Any) -> Any:
    import torch

    def kernel(*args: Any, **kwargs: Any) -> Any:
        found = list(_tensors([*args, *kwargs.values()]))
        widest = torch.float32 if any(t.dtype == torch.float32 for t in found) else torch.bfloat16
        new_args, new_kwargs = _map_args(
            op, args, kwargs, lambda v, kind: _cast_value(v, kind, widest) if kind in _CASTABLE_TYPES else v
        )
        return _below_autocast(op, new_args, new_kwargs)

    return kernel


def _banned_kernel(*args: Any, **kwargs: Any) -> Any:
    raise RunError(
        "binary_cross_entropy is unsafe to autocast (CUDA autocast refuses it).",
        "Use binary_cross_entropy_with_logits.",
    )


def _kernel_for(name: str) -> Any:
    import torch

    op = _overload(name)
    if name in FP32_OPS:
        return _cast_kernel(op, torch.float32)
    if name in LOWER_PRECISION_OPS:
        return _cast_kernel(op, torch.bfloat16)
    if name in FP32_SET_OPT_DTYPE_OPS:
        return _set_opt_dtype_kernel(op)
    if name in FP32_APPEND_DTYPE_OPS:
        return _append_dtype_kernel(op, _overload(FP32_APPEND_DTYPE_OPS[name]))
    if name in PROMOTE_OPS:
        return _promote_kernel(op)
    return _banned_kernel


def _probe_kept() -> None:
    """The kept cpu kernels cast to bfloat16 (lower precision), as CUDA's do."""
    import torch
    import torch.nn.functional as F

    a, b = torch.ones(2, 2), torch.ones(1, 2, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        outs = {
            "linear": F.linear(a, a),
            "matmul": torch.matmul(a, a),
            "mm": torch.mm(a, a),
            "bmm": torch.bmm(b, b),
            "baddbmm": torch.baddbmm(b, b, b),
            "addmm": torch.addmm(a, a, a),
            "addbmm": torch.addbmm(a, b, b),
            "scaled_dot_product_attention": F.scaled_dot_product_attention(b[None], b[None], b[None]),
        }
    wrong = sorted(name for name, out in outs.items() if out.dtype != torch.bfloat16)
    if wrong:
        raise RunError(
            f"cpu autocast no longer runs {', '.join(wrong)} in bfloat16, which the CUDA emulation relies on.",
            "Update grpo_pilot/verify/cuda_autocast.py KEPT_CPU_KERNELS for this torch version.",
        )


@contextmanager
def cuda_autocast_policy() -> Iterator[set[str]]:
    """Make cpu autocast follow CUDA's cast policy (module docstring) until exit; yields the ops given a
    Python kernel. Raises RunError when torch's CUDA lists differ from the tables above."""
    import torch

    cuda_ops, cpu_ops = _registered("AutocastCUDA"), _registered("AutocastCPU")
    ours = cuda_policy_ops()
    if cuda_ops != ours:
        raise RunError(
            "torch's CUDA autocast policy differs from the tables in grpo_pilot/verify/cuda_autocast.py "
            f"(missing here: {sorted(cuda_ops - ours)}; not in torch: {sorted(ours - cuda_ops)}).",
            "Update the tables from torch/include/ATen/autocast_mode.h of this torch version.",
        )
    _probe_kept()
    overridden = cuda_ops - set(KEPT_CPU_KERNELS)
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
            for name in sorted(overridden):
                lib.impl(name, _kernel_for(name), "AutocastCPU")
            for name in sorted(cpu_ops - cuda_ops):
                lib.impl(name, torch.library.fallthrough_kernel, "AutocastCPU")
        yield overridden
    finally:
        lib._destroy()
