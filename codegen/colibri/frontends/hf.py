"""Hugging Face checkpoints: safetensors reader, architecture table, one MoE block -> MoELayer.

A checkpoint directory holds ``config.json`` (with ``"architectures"``) and either
``model.safetensors`` or shards listed by ``model.safetensors.index.json``. Every header entry
is checked against the file first (:class:`SafetensorsFile`: one-line errors naming the tensor),
then by the ``safetensors`` package (its map closed again). Tensors are read with plain reads,
not through a memory map, whose touched pages would stay in the process's resident set (a whole
checkpoint's worth); bf16 is read as uint16 and shifted into the high half of a float32. Pickle
files (``pytorch_model.bin``) are never opened.

Supported architectures (:data:`ARCHITECTURES`): Mixtral (top-k gates always renormalised),
Qwen2-MoE (``norm_topk_prob``, a shared expert with a sigmoid gate, dense layers from
``mlp_only_layers`` / ``decoder_sparse_step``) and OLMoE (``norm_topk_prob``). Their experts
are SwiGLU without biases: ``down(silu(gate(x)) * up(x))``, which is the IR's
``(silu(x W1) * (x W3)) W2`` with ``W1 = gate.T``, ``W3 = up.T``, ``W2 = down.T``.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from ..errors import ConfigError, ModelFormatError, ShapeError
from ..ir.moe import Expert, MoEConfig, MoELayer
from .seed import read_config_json

CONFIG_NAME = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

#: safetensors dtype -> (numpy dtype of the raw data, bytes per element).
SAFETENSORS_DTYPES: dict[str, str] = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8"}
#: More decoder layers than this is not a real config.json (the largest models have ~100).
MAX_LAYERS = 1 << 16
#: A header larger than this is not a real safetensors file (the reference reader's limit).
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file, as its header describes it (checked)."""

    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offsets
    end: int


class SafetensorsFile:
    """A safetensors file whose header has been read and checked against the file's size."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFormatError(f"{self.path}: no such safetensors file")
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelFormatError(
                    f"{self.path}: truncated: {size} bytes, a safetensors file starts with an "
                    f"8-byte header length"
                )
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise ModelFormatError(
                    f"{self.path}: header length {n} does not fit the file ({size} bytes); "
                    f"the file is truncated or not safetensors"
                )
            raw = f.read(n)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ModelFormatError(f"{self.path}: header is not valid JSON ({exc})") from exc
        if not isinstance(header, dict):
            raise ModelFormatError(f"{self.path}: header is not a JSON object")
        data_start = 8 + n
        data_size = size - data_start
        self.metadata = header.pop("__metadata__", None) or {}
        self.tensors: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            self.tensors[name] = self._check_entry(name, entry, data_start, data_size)
        self._check_no_overlap()
        try:  # the package's own checks too (e.g. no gap between tensors); its map is closed
            with safe_open(str(self.path), framework="numpy"):
                pass
        except SafetensorError as exc:
            raise ModelFormatError(f"{self.path}: not a valid safetensors file ({exc})") from exc

    def _check_no_overlap(self) -> None:
        """Two tensors may not share bytes (a crafted header could alias them)."""
        spans = sorted((t.begin, t.end, n) for n, t in self.tensors.items() if t.end > t.begin)
        for (_, end_a, a), (begin_b, _, b) in zip(spans, spans[1:]):
            if begin_b < end_a:
                raise ModelFormatError(
                    f"{self.path}: tensors '{a}' and '{b}' overlap ('{b}' starts at file byte "
                    f"{begin_b}, before '{a}' ends at {end_a}); each tensor needs its own bytes: "
                    f"the header is corrupt"
                )

    def _check_entry(self, name: str, entry: Any, data_start: int, data_size: int) -> TensorInfo:
        where = f"{self.path}: tensor '{name}'"
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
            raise ModelFormatError(f"{where}: header entry needs dtype, shape and data_offsets")
        dtype = entry["dtype"]
        if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
            raise ModelFormatError(
                f"{where}: dtype {dtype!r} is not supported; supported: "
                f"{', '.join(SAFETENSORS_DTYPES)}"
            )
        shape = entry["shape"]
        offsets = entry["data_offsets"]
        if not isinstance(shape, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape
        ):
            raise ModelFormatError(f"{where}: shape {shape!r} is not a list of integers >= 0")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        ):
            raise ModelFormatError(f"{where}: data_offsets {offsets!r} is not [begin, end]")
        begin, end = offsets
        if not 0 <= begin <= end <= data_size:
            raise ModelFormatError(
                f"{where}: data_offsets [{begin}, {end}] lie outside the data section "
                f"({data_size} bytes); the header lies or the file is truncated"
            )
        itemsize = np.dtype(SAFETENSORS_DTYPES[dtype]).itemsize
        expected = math.prod(shape) * itemsize
        if end - begin != expected:
            raise ModelFormatError(
                f"{where}: data_offsets span {end - begin} bytes but shape {shape} of {dtype} "
                f"needs {expected}; the header is inconsistent"
            )
        return TensorInfo(dtype, tuple(shape), data_start + begin, data_start + end)

    def read(self, name: str) -> np.ndarray:
        """The tensor as a float32 array (fp16/bf16/fp64 converted), read from the file with
        plain reads rather than through the package's memory map: the pages a map touches stay
        in this process's resident set, a file's worth of them for a whole model."""
        info = self.tensors[name]
        raw = np.dtype(SAFETENSORS_DTYPES[info.dtype])
        n = (info.end - info.begin) // raw.itemsize
        arr = np.empty(n, raw)
        with open(self.path, "rb") as f:
            f.seek(info.begin)
            got = f.readinto(arr.data.cast("B")) if n else 0
        if got != n * raw.itemsize:
            raise ModelFormatError(f"{self.path}: tensor '{name}' is truncated")
        if info.dtype == "BF16":  # numpy has no bfloat16: the bits are float32's high half
            return (arr.astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(info.shape)
        return arr.reshape(info.shape).astype(np.float32, copy=False)


def write_safetensors(tensors: dict[str, np.ndarray], path: str | os.PathLike[str]) -> Path:
    """Write arrays as float32 tensors of a safetensors file (tests and tools; no torch)."""
    save_file({k: np.array(v, dtype="<f4", order="C") for k, v in tensors.items()}, str(path))
    return Path(path)


@dataclass(frozen=True)
class Architecture:
    """How one Hugging Face architecture names its MoE block's config fields and tensors."""

    name: str
    n_experts_key: str
    d_ff_key: str
    moe_prefixes: tuple[str, ...]  # under model.layers.{i}.
    expert_names: tuple[str, str, str]  # gate (W1), up (W3), down (W2)
    always_renormalise: bool
    has_shared_expert: bool = False
    qk_norm: bool = False


ARCHITECTURES: dict[str, Architecture] = {
    "MixtralForCausalLM": Architecture(
        "MixtralForCausalLM",
        "num_local_experts",
        "intermediate_size",
        ("block_sparse_moe", "mlp"),
        ("w1", "w3", "w2"),
        always_renormalise=True,
    ),
    "Qwen2MoeForCausalLM": Architecture(
        "Qwen2MoeForCausalLM",
        "num_experts",
        "moe_intermediate_size",
        ("mlp",),
        ("gate_proj", "up_proj", "down_proj"),
        always_renormalise=False,
        has_shared_expert=True,
    ),
    "OlmoeForCausalLM": Architecture(
        "OlmoeForCausalLM",
        "num_experts",
        "intermediate_size",
        ("mlp",),
        ("gate_proj", "up_proj", "down_proj"),
        always_renormalise=False,
        qk_norm=True,
    ),
}


def supported_architectures() -> str:
    return ", ".join(ARCHITECTURES)


def is_hf_checkpoint(path: str | os.PathLike[str]) -> bool:
    """A directory whose config.json names "architectures" (a Hugging Face checkpoint)."""
    cfg = Path(path) / CONFIG_NAME
    if not cfg.is_file():
        return False
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return False
    return isinstance(data, dict) and "architectures" in data


def is_whole(path: str | os.PathLike[str], config: str | None, layer: int | None) -> bool:
    """Whether the CLI reads `path` as a whole decoder: a Hugging Face checkpoint directory
    given without --layer and --config (anything else is one MoE layer)."""
    return layer is None and config is None and is_hf_checkpoint(path)


def check_architectures(path: str | os.PathLike[str]) -> None:
    """Refuse a directory that holds a Hugging Face checkpoint's weights (model.safetensors or
    its index) beside a config.json without "architectures": a ConfigError naming the field
    and the supported values, instead of treating the directory as something else."""
    p = Path(path)
    cfg = p / CONFIG_NAME
    if not p.is_dir() or not cfg.is_file() or is_hf_checkpoint(p):
        return
    if not ((p / SINGLE_FILE).is_file() or (p / INDEX_FILE).is_file()):
        return
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ConfigError(
            f"{cfg}: not valid JSON ({exc}); a Hugging Face checkpoint's config.json is a JSON "
            f'object naming its "architectures"'
        ) from exc
    what = "is not a JSON object" if not isinstance(data, dict) else 'has no field "architectures"'
    raise ConfigError(
        f"{cfg}: {what}; a Hugging Face checkpoint names its model class there, e.g. "
        f'"architectures": ["MixtralForCausalLM"]; supported: {supported_architectures()}'
    )


def config_int(cfg: dict[str, Any], key: str, source: str, minimum: int = 1) -> int:
    """An integer field of an HF config.json, checked; errors name the field and file."""
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"{source}: missing field '{key}' (an integer >= {minimum})")
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(f"{source}: field '{key}' must be an integer >= {minimum}, got {v!r}")
    return v


def config_positive_float(source: str, key: str, v: Any) -> float:
    """A number field of an HF config.json that must be finite and > 0 (rms_norm_eps,
    rope_theta, clip_qkv: 0, NaN or Inf would make every output NaN); errors name the field,
    the value and the range."""
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not 0 < v < math.inf  # also refuses NaN
    ):
        raise ConfigError(
            f"{source}: field '{key}' = {v!r} is out of range; it must be a finite number > 0"
        )
    return float(v)


class HFConfig:
    """A Hugging Face config.json: its architecture and checked fields."""

    def __init__(self, cfg: Any, source: str) -> None:
        self.config_source = source
        if not isinstance(cfg, dict):
            raise ConfigError(f"{source}: expected a JSON object")
        self.config: dict[str, Any] = cfg
        archs = cfg.get("architectures")
        if not isinstance(archs, list) or not archs:
            raise ConfigError(
                f"{source}: field 'architectures' must be a non-empty list; supported: "
                f"{supported_architectures()}"
            )
        known = [a for a in archs if isinstance(a, str) and a in ARCHITECTURES]
        if not known:
            raise ConfigError(
                f"{source}: architecture {', '.join(map(str, archs))} is not supported; "
                f"supported: {supported_architectures()}"
            )
        self.arch = ARCHITECTURES[known[0]]

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> HFConfig:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        return cls(read_config_json(path), str(path))

    def get_int(self, key: str, minimum: int = 1) -> int:
        return config_int(self.config, key, self.config_source, minimum)

    @property
    def n_layers(self) -> int:
        n = self.get_int("num_hidden_layers")
        if n > MAX_LAYERS:
            raise ConfigError(
                f"{self.config_source}: field 'num_hidden_layers' = {n} is over {MAX_LAYERS}; "
                f"the config is corrupt"
            )
        return n

    def is_moe_layer(self, i: int) -> bool:
        """Qwen2-MoE: dense MLP in mlp_only_layers and where (i+1) % decoder_sparse_step != 0."""
        if self.arch.name != "Qwen2MoeForCausalLM":
            return True
        only = self.config.get("mlp_only_layers") or []
        if not isinstance(only, list):
            raise ConfigError(
                f"{self.config_source}: field 'mlp_only_layers' must be a list of layer "
                f"indices, got {only!r}"
            )
        step = self.config.get("decoder_sparse_step", 1) or 1
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ConfigError(
                f"{self.config_source}: field 'decoder_sparse_step' must be an integer >= 1, "
                f"got {step!r}"
            )
        return i not in only and self.get_int(self.arch.n_experts_key) > 0 and (i + 1) % step == 0

    def check_silu(self) -> None:
        act = self.config.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(
                f"{self.config_source}: hidden_act {act!r} is not supported for "
                f"{self.arch.name}; supported: 'silu' (SwiGLU experts)"
            )


class ArrayTensors:
    """Named float arrays (e.g. a PyTorch state_dict) with the checkpoint's error messages."""

    def __init__(self, arrays: dict[str, np.ndarray], source: str) -> None:
        self.arrays = arrays
        self.source = source

    def has(self, name: str) -> bool:
        return name in self.arrays

    def tensor(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        if name not in self.arrays:
            raise ModelFormatError(
                f"{self.source}: tensor '{name}' is missing (have: "
                f"{', '.join(sorted(self.arrays)[:8])}{' ...' if len(self.arrays) > 8 else ''})"
            )
        arr = np.asarray(self.arrays[name])
        if shape is not None and tuple(arr.shape) != tuple(shape):
            raise ShapeError(
                f"{self.source}: tensor '{name}' has shape {list(arr.shape)}, but the config "
                f"implies {list(shape)}; the config and the weights disagree"
            )
        if arr.dtype.kind != "f":
            raise ModelFormatError(f"{self.source}: tensor '{name}' is {arr.dtype}, not float")
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if not np.all(np.isfinite(arr)):
            raise ModelFormatError(f"{self.source}: tensor '{name}' contains NaN/Inf values")
        return arr


class HFCheckpoint(HFConfig):
    """A Hugging Face checkpoint directory: its config and a name -> shard index of tensors."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        cfg_path = self.path / CONFIG_NAME
        if not cfg_path.is_file():
            raise ConfigError(f"{self.path}: no config.json; not a Hugging Face checkpoint")
        super().__init__(read_config_json(cfg_path), str(cfg_path))
        self._files: dict[str, SafetensorsFile] = {}
        self._where: dict[str, str] = {}
        index = self.path / INDEX_FILE
        if index.is_file():
            self._read_index(index)
        elif (self.path / SINGLE_FILE).is_file():
            st = self._open(SINGLE_FILE)
            self._where = dict.fromkeys(st.tensors, SINGLE_FILE)
        else:
            pickles = sorted(p.name for p in self.path.glob("*.bin"))
            hint = (
                f" ({', '.join(pickles)} are pickle files, which Colibri never opens: re-save "
                f"with save_pretrained(safe_serialization=True))"
                if pickles
                else ""
            )
            raise ModelFormatError(f"{self.path}: no {SINGLE_FILE} or {INDEX_FILE}{hint}")

    def _read_index(self, index: Path) -> None:
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
            weight_map = data["weight_map"]
        except (
            UnicodeDecodeError,
            json.JSONDecodeError,
            RecursionError,
            KeyError,
            TypeError,
        ) as exc:
            raise ModelFormatError(f"{index}: not a safetensors index ({exc})") from exc
        if not isinstance(weight_map, dict):
            raise ModelFormatError(f"{index}: 'weight_map' must map tensor names to files")
        self._where = {str(k): str(v) for k, v in weight_map.items()}
        for shard in sorted(set(self._where.values())):
            if not (self.path / shard).is_file():
                names = [k for k, v in self._where.items() if v == shard]
                raise ModelFormatError(
                    f"{self.path / shard}: shard listed in {INDEX_FILE} is missing "
                    f"({len(names)} tensors, e.g. '{names[0]}'); copy the whole checkpoint"
                )
            st = self._open(shard)
            for name in (k for k, v in self._where.items() if v == shard):
                if name not in st.tensors:
                    raise ModelFormatError(
                        f"{st.path}: {INDEX_FILE} says it holds '{name}', but it does not"
                    )

    def _open(self, name: str) -> SafetensorsFile:
        if name not in self._files:
            self._files[name] = SafetensorsFile(self.path / name)
        return self._files[name]

    def names(self) -> list[str]:
        return sorted(self._where)

    def shard_files(self) -> list[str]:
        """The safetensors files holding the tensors (names relative to the directory)."""
        return sorted(set(self._where.values()))

    def has(self, name: str) -> bool:
        return name in self._where

    def shape(self, name: str) -> tuple[int, ...]:
        return self._open(self._where[name]).tensors[name].shape

    def dtype(self, name: str) -> str:
        """The safetensors dtype of tensor `name` as stored (F32, F16, BF16, F64)."""
        return self._open(self._where[name]).tensors[name].dtype

    def tensor(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Tensor `name` as float32; with `shape`, a mismatch is a ShapeError naming both."""
        if name not in self._where:
            raise ModelFormatError(
                f"{self.path}: tensor '{name}' is missing ({self.arch.name} checkpoints have it)"
            )
        st = self._open(self._where[name])
        info = st.tensors[name]
        if shape is not None and info.shape != tuple(shape):
            raise ShapeError(
                f"{st.path}: tensor '{name}' has shape {list(info.shape)}, but config.json "
                f"implies {list(shape)}; the config and the weights disagree"
            )
        arr = st.read(name)
        if not np.all(np.isfinite(arr)):
            raise ModelFormatError(f"{st.path}: tensor '{name}' contains NaN/Inf values")
        return arr


class TensorSource(Protocol):
    """Where a block's tensors come from: a checkpoint directory or a state_dict."""

    def has(self, name: str) -> bool: ...

    def tensor(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray: ...


def read_ffn(src: TensorSource, prefix: str, names: tuple[str, str, str], d: int, f: int) -> Expert:
    g, u, dn = names
    w1 = src.tensor(f"{prefix}{g}.weight", (f, d)).T.copy()
    w3 = src.tensor(f"{prefix}{u}.weight", (f, d)).T.copy()
    w2 = src.tensor(f"{prefix}{dn}.weight", (d, f)).T.copy()
    return Expert(w1=w1, w2=w2, w3=w3)


def moe_prefix(ckpt: HFCheckpoint, layer_index: int) -> str:
    """The tensor-name prefix (with its trailing dot) of layer `layer_index`'s MoE block."""
    for p in ckpt.arch.moe_prefixes:
        prefix = f"model.layers.{layer_index}.{p}."
        if ckpt.has(f"{prefix}gate.weight"):
            return prefix
    prefix = f"model.layers.{layer_index}.{ckpt.arch.moe_prefixes[0]}."
    raise ModelFormatError(
        f"{ckpt.path}: tensor '{prefix}gate.weight' (the router of layer {layer_index}) is "
        f"missing from the checkpoint"
    )


def moe_block_config(cfg: HFConfig) -> MoEConfig:
    """The MoEConfig of the architecture's sparse MoE block (renormalisation per transformers:
    Mixtral always renormalises the top-k gates, Qwen2-MoE and OLMoE when norm_topk_prob)."""
    arch = cfg.arch
    src = cfg.config_source
    cfg.check_silu()
    d = cfg.get_int("hidden_size")
    f = cfg.get_int(arch.d_ff_key)
    n_exp = cfg.get_int(arch.n_experts_key)
    k = cfg.get_int("num_experts_per_tok")
    if k > n_exp:
        raise ConfigError(
            f"{src}: num_experts_per_tok={k} is larger than {arch.n_experts_key}={n_exp}"
        )
    if arch.always_renormalise:
        norm = True
    else:
        norm = cfg.config.get("norm_topk_prob", False)
        if not isinstance(norm, bool):
            raise ConfigError(f"{src}: field 'norm_topk_prob' must be true or false, got {norm!r}")
    vocab = cfg.config.get("vocab_size")
    return MoEConfig(
        n_experts=n_exp,
        top_k=k,
        d_model=d,
        d_ff=f,
        activation="silu",
        gated=True,
        norm_topk_prob=norm,
        vocab_size=vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None,
    )


def moe_layer_from_tensors(
    cfg: HFConfig, src: TensorSource, prefix: str, source: str, layer_index: int | None = None
) -> MoELayer:
    """Build the MoELayer of one sparse MoE block whose tensors are `prefix` + transformers'
    names: ``gate.weight`` and per-expert ``experts.{e}.<gate/up/down>.weight`` (checkpoint
    layout) or fused ``experts.gate_up_proj`` / ``experts.down_proj`` (module layout)."""
    arch = cfg.arch
    config = moe_block_config(cfg)
    n_exp, d, f = config.n_experts, config.d_model, config.d_ff
    router = src.tensor(f"{prefix}gate.weight", (n_exp, d))
    experts: list[Expert] = []
    if src.has(f"{prefix}experts.gate_up_proj"):
        gate_up = src.tensor(f"{prefix}experts.gate_up_proj", (n_exp, 2 * f, d))
        down = src.tensor(f"{prefix}experts.down_proj", (n_exp, d, f))
        for e in range(n_exp):
            experts.append(
                Expert(w1=gate_up[e, :f].T.copy(), w3=gate_up[e, f:].T.copy(), w2=down[e].T.copy())
            )
    else:
        for e in range(n_exp):
            experts.append(read_ffn(src, f"{prefix}experts.{e}.", arch.expert_names, d, f))
    shared: Expert | None = None
    shared_gate: np.ndarray | None = None
    if arch.has_shared_expert:
        f_s = cfg.get_int("shared_expert_intermediate_size")
        shared = read_ffn(src, f"{prefix}shared_expert.", arch.expert_names, d, f_s)
        shared_gate = src.tensor(f"{prefix}shared_expert_gate.weight", (1, d))[0].copy()
    meta: dict[str, Any] = {"architecture": arch.name}
    if layer_index is not None:
        meta["layer"] = layer_index
    layer = MoELayer(
        config=config,
        router_w=router,
        router_b=None,
        experts=experts,
        source=source,
        metadata=meta,
        shared_expert=shared,
        shared_gate=shared_gate,
    )
    return layer.validate()


def load_hf_moe_layer(path: str | os.PathLike[str] | HFCheckpoint, layer_index: int) -> MoELayer:
    """The MoE block of decoder layer `layer_index` of a Hugging Face checkpoint as a MoELayer."""
    ckpt = path if isinstance(path, HFCheckpoint) else HFCheckpoint(path)
    ckpt.check_silu()
    n_layers = ckpt.n_layers
    if not 0 <= layer_index < n_layers:
        raise ConfigError(
            f"{ckpt.config_source}: --layer {layer_index} is out of range; the model has "
            f"num_hidden_layers={n_layers} (layers 0..{n_layers - 1})"
        )
    if not ckpt.is_moe_layer(layer_index):
        moe = [i for i in range(n_layers) if ckpt.is_moe_layer(i)]
        raise ConfigError(
            f"{ckpt.config_source}: layer {layer_index} is a dense MLP (mlp_only_layers / "
            f"decoder_sparse_step), not an MoE block; MoE layers: {moe}"
        )
    moe_block_config(ckpt)  # config errors before tensor errors
    prefix = moe_prefix(ckpt, layer_index)
    source = f"{ckpt.path} (layer {layer_index}, {ckpt.arch.name})"
    return moe_layer_from_tensors(ckpt, ckpt, prefix, source, layer_index)
