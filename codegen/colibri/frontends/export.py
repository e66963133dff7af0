"""`colibri export`: a PyTorch MoE block -> Colibri container, checked against PyTorch.

Sources: a PyTorch ``state_dict`` file of one sparse MoE block (read with
``torch.load(weights_only=True)``: tensors only, no code runs), with the model's Hugging Face
``config.json`` naming the architecture; or a Hugging Face checkpoint directory with
``--layer N``. :func:`read_block` gives the IR and the block's tensors in transformers' module
layout; :func:`torch_block` builds transformers' own block module (MixtralSparseMoeBlock,
OlmoeSparseMoeBlock, Qwen2MoeSparseMoeBlock) holding them, which
:func:`colibri.reference.accuracy.check_against_torch` compares with the numpy reference.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ColibriError, ConfigError, ModelFormatError
from ..ir.moe import MoELayer
from .hf import (
    ARCHITECTURES,
    ArrayTensors,
    HFCheckpoint,
    HFConfig,
    is_hf_checkpoint,
    load_hf_moe_layer,
    moe_layer_from_tensors,
    moe_prefix,
)

#: Export check tolerance, relative to max |y| (reference.compare): the float64 reference vs
#: PyTorch's fp32 block measures ~1e-7.
EXPORT_TOLERANCE = 1e-5
DEFAULT_CHECK_TOKENS = 8

#: transformers' sparse MoE block class per architecture.
BLOCK_CLASSES = {
    "MixtralForCausalLM": ("transformers.models.mixtral.modeling_mixtral", "MixtralSparseMoeBlock"),
    "Qwen2MoeForCausalLM": (
        "transformers.models.qwen2_moe.modeling_qwen2_moe",
        "Qwen2MoeSparseMoeBlock",
    ),
    "OlmoeForCausalLM": ("transformers.models.olmoe.modeling_olmoe", "OlmoeSparseMoeBlock"),
}


class ExportCheckFailed(ColibriError):
    """The exported block does not reproduce the PyTorch module's output."""


def import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ConfigError(
            f"colibri export needs PyTorch and transformers ({exc}); install them with "
            f"pip install -e '.[torch]'"
        ) from exc
    return torch


def load_state_dict(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """A state_dict file as float32 numpy arrays; never runs pickled code (weights_only)."""
    torch = import_torch()
    p = Path(path)
    if not p.is_file():
        raise ModelFormatError(f"{p}: no such state_dict file")
    try:
        sd = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for corrupt or unsafe files
        raise ModelFormatError(
            f"{p}: not a readable PyTorch state_dict with weights_only=True ({exc})"
        ) from exc
    if not isinstance(sd, dict) or not sd:
        raise ModelFormatError(
            f"{p}: expected a non-empty dict of tensors (module.state_dict()), got "
            f"{type(sd).__name__}"
        )
    out: dict[str, np.ndarray] = {}
    for name, t in sd.items():
        if not isinstance(t, torch.Tensor):
            raise ModelFormatError(f"{p}: entry '{name}' is {type(t).__name__}, not a tensor")
        if not t.is_floating_point():
            raise ModelFormatError(f"{p}: tensor '{name}' has dtype {t.dtype}, expected float")
        out[str(name)] = t.detach().to(torch.float32).cpu().numpy()
    return out


def _block_prefix(arrays: dict[str, np.ndarray], source: str) -> str:
    """'' for a block's own state_dict, else the prefix of the one router in it."""
    if "gate.weight" in arrays:
        return ""
    routers = [
        k[: -len("gate.weight")]
        for k in arrays
        if k.endswith(".gate.weight")
        and not k.endswith("shared_expert_gate.weight")
        and ".shared_expert." not in k
    ]
    if len(routers) == 1:
        return routers[0]
    raise ModelFormatError(
        f"{source}: cannot find the block's router: expected 'gate.weight' (the state_dict of "
        f"one sparse MoE block), found {len(routers)} candidates"
        + (f" ({', '.join(sorted(routers)[:4])})" if routers else "")
    )


def torch_block(cfg: HFConfig, state: dict[str, np.ndarray]) -> Any:
    """transformers' sparse MoE block for `cfg` with `state` loaded (strict), fp32, eval."""
    torch = import_torch()
    import importlib

    import transformers

    module_name, cls_name = BLOCK_CLASSES[cfg.arch.name]
    config_cls = getattr(transformers, cfg.arch.name.replace("ForCausalLM", "Config"))
    hf_cfg = config_cls.from_dict(cfg.config)
    hf_cfg._experts_implementation = "eager"  # the plain per-expert loop, as in the model
    block = getattr(importlib.import_module(module_name), cls_name)(hf_cfg)
    block.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    return block.to(torch.float32).eval()


def read_block(
    source: str | os.PathLike[str],
    layer_index: int | None = None,
    config: str | os.PathLike[str] | None = None,
) -> tuple[MoELayer, HFConfig, dict[str, np.ndarray]]:
    """One MoE block of a checkpoint directory or a state_dict file: the IR, the Hugging Face
    config and the block's tensors in transformers' module layout (for the PyTorch check)."""
    src = Path(source)
    if src.is_dir():
        if not is_hf_checkpoint(src):
            raise ModelFormatError(
                f'{src}: not a Hugging Face checkpoint (config.json with "architectures"); '
                f"export takes a checkpoint directory or a state_dict file"
            )
        ckpt = HFCheckpoint(src)
        if layer_index is None:
            raise ConfigError(
                f"{src}: a whole {ckpt.arch.name} model; pass --layer N to export one MoE block"
            )
        if config is not None:
            raise ConfigError("--config is only for state_dict files; a checkpoint has its own")
        layer = load_hf_moe_layer(ckpt, layer_index)
        cfg: HFConfig = ckpt
        prefix = moe_prefix(ckpt, layer_index)
        state = {n[len(prefix) :]: ckpt.tensor(n) for n in ckpt.names() if n.startswith(prefix)}
    else:
        if layer_index is not None:
            raise ConfigError("--layer applies to checkpoint directories, not state_dict files")
        if config is None:
            raise ConfigError(
                f"{src}: a state_dict does not say its architecture, top-k or gate "
                f"normalisation; pass --config with the model's Hugging Face config.json"
            )
        cfg = HFConfig.from_file(config)
        arrays = load_state_dict(src)
        prefix = _block_prefix(arrays, str(src))
        layer = moe_layer_from_tensors(
            cfg, ArrayTensors(arrays, str(src)), prefix, f"{src} ({cfg.arch.name} block)"
        )
        state = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
    return layer, cfg, _to_module_layout(layer, state, cfg.arch.name)


def _to_module_layout(
    layer: MoELayer, state: dict[str, np.ndarray], arch: str
) -> dict[str, np.ndarray]:
    """The block's tensors as transformers' module expects them: per-expert checkpoint names
    (experts.{e}.w1 ... / gate_proj ...) are stacked into experts.gate_up_proj / down_proj
    exactly as transformers' loader does; other names pass through unchanged."""
    if "experts.gate_up_proj" in state:
        return state
    g, u, dn = ARCHITECTURES[arch].expert_names
    n = layer.config.n_experts
    out = {k: v for k, v in state.items() if not k.startswith("experts.")}
    out["experts.gate_up_proj"] = np.stack(
        [
            np.concatenate([state[f"experts.{e}.{g}.weight"], state[f"experts.{e}.{u}.weight"]])
            for e in range(n)
        ]
    )
    out["experts.down_proj"] = np.stack([state[f"experts.{e}.{dn}.weight"] for e in range(n)])
    return out
