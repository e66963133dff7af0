"""The intermediate representation: one MoE layer as dataclasses of numpy arrays.

Every importer produces an :class:`MoELayer`; every later stage (quantise, layout, plan, emit,
reference) reads only this. Weights are float32, row-major, in the seed layout:
``w1 [d_model, d_ff]``, ``w2 [d_ff, d_model]``, router ``[n_experts, d_model]``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError, ModelFormatError, ShapeError

#: Activations of the plain (non-gated) expert FFN, in C enum order (colibri_activation).
ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_tanh", "silu", "relu")
#: The activation used when config.json names none: exact (erf) gelu, as in the seed articles.
DEFAULT_ACTIVATION = "gelu"
#: Name of the gated SwiGLU form in config.json (``(silu(x W1) * (x W3)) W2``).
GATED_ACTIVATION = "swiglu"

#: Flags of the binary header / colibri_model_t (colibri.h COLIBRI_FLAG_*).
FLAG_NORM_TOPK = 0x1
FLAG_GATED = 0x2
FLAG_ROUTER_BIAS = 0x4
FLAG_EXPERT_BIAS = 0x8

MAX_TOP_K = 64  # COLIBRI_MAX_TOP_K


@dataclass(frozen=True)
class MoEConfig:
    """Dimensions and options of one MoE layer (config.json vocabulary in docs/format.md)."""

    n_experts: int
    top_k: int
    d_model: int
    d_ff: int
    activation: str = DEFAULT_ACTIVATION
    gated: bool = False
    norm_topk_prob: bool = False
    vocab_size: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The config.json form of this config."""
        out: dict[str, Any] = {
            "n_experts": self.n_experts,
            "k": self.top_k,
            "hidden_size": self.d_model,
            "intermediate_size": self.d_ff,
            "activation": GATED_ACTIVATION if self.gated else self.activation,
            "norm_topk_prob": self.norm_topk_prob,
        }
        if self.vocab_size is not None:
            out["vocab_size"] = self.vocab_size
        return out

    @property
    def activation_code(self) -> int:
        """The colibri_activation enum value (gated experts use silu)."""
        return ACTIVATIONS.index("silu" if self.gated else self.activation)


def _require_int(cfg: dict[str, Any], key: str, source: str, minimum: int = 1) -> int:
    if key not in cfg:
        raise ConfigError(f"{source}: missing field '{key}' (an integer >= {minimum}); add it")
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"{source}: field '{key}' must be an integer, got {value!r} ({type(value).__name__})"
        )
    if value < minimum:
        raise ConfigError(f"{source}: field '{key}' must be >= {minimum}, got {value}")
    return value


def parse_config(cfg: Any, source: str) -> MoEConfig:
    """Validate a config.json object; errors name the field and the file."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(cfg).__name__}")
    n_experts = _require_int(cfg, "n_experts", source)
    top_k = _require_int(cfg, "k", source, minimum=-(2**31))
    d_model = _require_int(cfg, "hidden_size", source)
    d_ff = _require_int(cfg, "intermediate_size", source)
    if top_k <= 0:
        raise ConfigError(f"{source}: field 'k' must be >= 1 (experts per token), got {top_k}")
    if top_k > n_experts:
        raise ConfigError(
            f"{source}: field 'k' = {top_k} is larger than 'n_experts' = {n_experts}; "
            f"k must be between 1 and n_experts"
        )
    if top_k > MAX_TOP_K:
        raise ConfigError(f"{source}: field 'k' = {top_k} exceeds the runtime maximum {MAX_TOP_K}")
    vocab = cfg.get("vocab_size")
    if vocab is not None:
        vocab = _require_int(cfg, "vocab_size", source)
    activation = cfg.get("activation", DEFAULT_ACTIVATION)
    if not isinstance(activation, str):
        raise ConfigError(f"{source}: field 'activation' must be a string, got {activation!r}")
    activation = activation.lower()
    gated = activation == GATED_ACTIVATION
    if not gated and activation not in ACTIVATIONS:
        allowed = ", ".join((*ACTIVATIONS, GATED_ACTIVATION))
        raise ConfigError(
            f"{source}: unknown activation '{activation}' in field 'activation'; "
            f"supported: {allowed}"
        )
    norm = cfg.get("norm_topk_prob", False)
    if not isinstance(norm, bool):
        raise ConfigError(f"{source}: field 'norm_topk_prob' must be true or false, got {norm!r}")
    return MoEConfig(
        n_experts=n_experts,
        top_k=top_k,
        d_model=d_model,
        d_ff=d_ff,
        activation="silu" if gated else activation,
        gated=gated,
        norm_topk_prob=norm,
        vocab_size=vocab,
    )


@dataclass
class Expert:
    """One expert's FFN weights (float32). Biases are None when the model has none."""

    w1: np.ndarray
    w2: np.ndarray
    b1: np.ndarray | None = None
    b2: np.ndarray | None = None
    w3: np.ndarray | None = None

    def tensors(self) -> list[tuple[str, np.ndarray]]:
        """The expert's tensors in storage order (w1, b1, w2, b2, w3), absent ones skipped."""
        items = [("w1", self.w1), ("b1", self.b1), ("w2", self.w2), ("b2", self.b2)]
        items.append(("w3", self.w3))
        return [(n, a) for n, a in items if a is not None]

    def digest(self) -> str:
        """Content hash used to store identical experts once."""
        h = hashlib.sha256()
        for name, arr in self.tensors():
            h.update(name.encode())
            h.update(np.ascontiguousarray(arr, dtype="<f4").tobytes())
        return h.hexdigest()

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for _, a in self.tensors())


@dataclass
class MoELayer:
    """A single MoE layer: router + experts (+ optional explicit sharing map)."""

    config: MoEConfig
    router_w: np.ndarray
    router_b: np.ndarray | None
    experts: list[Expert]
    sharing_map: list[int] | None = None
    source: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Qwen2-MoE's shared expert: run on every token, same activation as the routed experts,
    #: its own intermediate size; its output is scaled by ``sigmoid(x . shared_gate)`` (or by
    #: 1 when shared_gate is None) and added to the routed experts' sum.
    shared_expert: Expert | None = None
    shared_gate: np.ndarray | None = None  # [d_model]
    #: :meth:`storage_map` when already known: set by a streamed `generate --calib`
    #: (colibri.cli.pipeline), which drops the fp32 weights of the experts it quantised.
    storage: list[int] | None = None

    def require_no_shared_expert(self, what: str) -> None:
        """Raise ConfigError when `what` (a stage) cannot represent the shared expert."""
        if self.shared_expert is not None:
            raise ConfigError(
                f"{self.source or 'model'}: the layer has a shared expert (Qwen2-MoE), which "
                f"{what} does not support for a single MoE layer; the numpy reference (colibri "
                f"reference) does, and the whole checkpoint (colibri generate without --layer) "
                f"generates C with its shared experts"
            )

    @property
    def flags(self) -> int:
        f = 0
        if self.config.norm_topk_prob:
            f |= FLAG_NORM_TOPK
        if self.config.gated:
            f |= FLAG_GATED
        if self.router_b is not None:
            f |= FLAG_ROUTER_BIAS
        if self.experts and self.experts[0].b1 is not None:
            f |= FLAG_EXPERT_BIAS
        return f

    def validate(self) -> MoELayer:
        """Check shapes, dtypes and finiteness; raise ShapeError/ModelFormatError naming it."""
        c = self.config
        src = self.source or "model"

        def check(name: str, arr: np.ndarray | None, shape: tuple[int, ...]) -> None:
            if arr is None:
                return
            if tuple(arr.shape) != shape:
                raise ShapeError(
                    f"{src}: tensor '{name}' has shape {tuple(arr.shape)}, expected {shape} "
                    f"from the config (n_experts={c.n_experts}, hidden_size={c.d_model}, "
                    f"intermediate_size={c.d_ff})"
                )
            if arr.dtype != np.float32:
                raise ModelFormatError(f"{src}: tensor '{name}' is {arr.dtype}, expected float32")
            if not np.all(np.isfinite(arr)):
                bad = int(np.count_nonzero(~np.isfinite(arr)))
                raise ModelFormatError(
                    f"{src}: tensor '{name}' contains {bad} NaN/Inf values; "
                    f"the model file is corrupt or was exported from a diverged checkpoint"
                )

        check("router.weight", self.router_w, (c.n_experts, c.d_model))
        check("router.bias", self.router_b, (c.n_experts,))
        if len(self.experts) != c.n_experts:
            raise ShapeError(
                f"{src}: {len(self.experts)} experts present, config says n_experts={c.n_experts}"
            )
        has_bias = self.experts[0].b1 is not None
        for i, e in enumerate(self.experts):
            check(f"expert.{i}.w1", e.w1, (c.d_model, c.d_ff))
            check(f"expert.{i}.b1", e.b1, (c.d_ff,))
            check(f"expert.{i}.w2", e.w2, (c.d_ff, c.d_model))
            check(f"expert.{i}.b2", e.b2, (c.d_model,))
            check(f"expert.{i}.w3", e.w3, (c.d_model, c.d_ff))
            if (e.b1 is not None) != has_bias or (e.b2 is not None) != has_bias:
                raise ShapeError(f"{src}: expert {i} biases differ from expert 0's")
            if c.gated and e.w3 is None:
                raise ShapeError(f"{src}: expert {i} has no w3 but the activation is swiglu")
            if not c.gated and e.w3 is not None:
                raise ShapeError(f"{src}: expert {i} has w3 but the activation is not swiglu")
        if self.sharing_map is not None:
            validate_sharing_map(self.sharing_map, c.n_experts, src)
        if self.shared_expert is not None:
            se = self.shared_expert
            f_s = int(se.w1.shape[1]) if se.w1.ndim == 2 else -1
            check("shared_expert.w1", se.w1, (c.d_model, f_s))
            check("shared_expert.b1", se.b1, (f_s,))
            check("shared_expert.w2", se.w2, (f_s, c.d_model))
            check("shared_expert.b2", se.b2, (c.d_model,))
            check("shared_expert.w3", se.w3, (c.d_model, f_s))
            if c.gated != (se.w3 is not None):
                raise ShapeError(
                    f"{src}: the shared expert {'lacks' if c.gated else 'has'} w3 but the "
                    f"activation is {'swiglu' if c.gated else c.activation}"
                )
        elif self.shared_gate is not None:
            raise ShapeError(f"{src}: shared_gate is set but there is no shared expert")
        check("shared_gate", self.shared_gate, (c.d_model,))
        return self

    def storage_map(self) -> list[int]:
        """Expert i is stored as expert storage_map()[i]: explicit sharing first, then experts
        whose weights are identical by content hash are stored once (lowest index keeps them)."""
        if self.storage is not None:
            return list(self.storage)
        base = list(self.sharing_map) if self.sharing_map else list(range(self.config.n_experts))
        first_by_digest: dict[str, int] = {}
        out = []
        for i in range(self.config.n_experts):
            owner = base[i]
            d = self.experts[owner].digest()
            out.append(first_by_digest.setdefault(d, owner))
        return out


def validate_sharing_map(mapping: list[int], n_experts: int, source: str) -> None:
    """map[i] must be a valid expert that maps to itself."""
    if len(mapping) != n_experts:
        raise ConfigError(
            f"{source}: expert_sharing_map has {len(mapping)} entries, expected n_experts="
            f"{n_experts}"
        )
    for i, j in enumerate(mapping):
        if not 0 <= j < n_experts:
            raise ConfigError(
                f"{source}: expert_sharing_map[{i}] = {j} is not an expert index "
                f"(0..{n_experts - 1})"
            )
        if mapping[j] != j:
            raise ConfigError(
                f"{source}: expert_sharing_map[{i}] = {j}, but expert {j} itself maps to "
                f"{mapping[j]}; a shared expert must map to itself"
            )


def model_hash(layer: MoELayer) -> str:
    """SHA-256 of the model content (config + every tensor), independent of the file format."""
    h = hashlib.sha256(json.dumps(layer.config.to_json(), sort_keys=True).encode())
    h.update(np.ascontiguousarray(layer.router_w, "<f4").tobytes())
    if layer.router_b is not None:
        h.update(np.ascontiguousarray(layer.router_b, "<f4").tobytes())
    for e in layer.experts:
        h.update(e.digest().encode())
    h.update(json.dumps(layer.sharing_map).encode())
    return h.hexdigest()
