"""Python binding of the C runtime (ctypes + numpy), for services and for tests of the
runtime's file-loading paths: :class:`Runtime` (colibri_init on a container or a seed-layout
file, mmap'ed: one MoE block) and :class:`LM` (colibri_lm_init on a whole-model container,
version 2: token steps, logits and greedy generation, no per-model build).

The shared library is built from runtime_c/src (and runtime_c/arch/x86_64: paths.runtime_sources)
with the host's C compiler on first use and
cached under the tools directory, keyed by a hash of the sources.
"""

from __future__ import annotations

import ctypes
import hashlib
import operator
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..errors import (
    BindingTypeError,
    BindingValueError,
    BuildError,
    ColibriError,
    InputError,
    ToolchainNotFound,
)
from ..paths import resource_dir, runtime_sources, tools_dir

CACHE_POLICIES = {"none": 0, "lru": 1, "pinned": 2}
#: The largest int32 (every count and index the C API takes is an int32_t).
INT32_MAX = 2**31 - 1
#: colibri.h limits: top-k, LRU slots, experts of a file (the sharing map's longest length).
MAX_TOP_K, MAX_LRU_SLOTS, MAX_EXPERTS = 64, 256, 65535
#: colibri_lm.h limits: threads, prefill_batch.
MAX_THREADS, MAX_PREFILL_BATCH = 256, 4096


# -- argument checks: every argument is checked here, before the C runtime sees it ------------


def check_int(name: str, value: object, lo: int, hi: int) -> int:
    """`value` as an int in lo..hi: a Python or numpy integer (not a bool, not a float), else
    BindingTypeError; out of range, BindingValueError. Both name the argument."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise BindingTypeError(
            f"{name} must be an integer in {lo}..{hi}, got {type(value).__name__} {value!r}"
        )
    v = operator.index(value)
    if not lo <= v <= hi:
        raise BindingValueError(f"{name} must be in {lo}..{hi}, got {v}")
    return v


def check_path(name: str, value: object) -> bytes:
    """A file path (str, bytes or os.PathLike) as bytes for C; a NUL byte (C would cut the
    path there and open another file) is a BindingValueError."""
    if not isinstance(value, (str, bytes, os.PathLike)):
        raise BindingTypeError(f"{name} must be a path (str or os.PathLike), got {value!r}")
    raw = os.fsencode(value)
    if not raw or b"\0" in raw:
        raise BindingValueError(f"{name} must be a non-empty path without NUL bytes, got {value!r}")
    return raw


def check_activations(name: str, x: object, d_model: int) -> np.ndarray:
    """`x` as a C-contiguous float32 array [T, d_model] (T >= 0). Real numbers of any numpy
    dtype (float16/32/64, integers) are converted to float32; bool, complex, object and string
    arrays are a BindingTypeError. The wrong number of dimensions or width, and NaN / Inf
    (including a float64 beyond the float32 range), are a BindingValueError naming the first
    bad element: the C router would read past a short row or route on garbage."""
    try:
        arr = np.asarray(x)
    except (ValueError, TypeError) as exc:  # ragged lists
        raise BindingTypeError(
            f"{name} must be a 2-D array of floats (tokens, d_model), got a ragged or mixed "
            f"sequence ({exc})"
        ) from None
    if arr.dtype.kind not in "fiu":
        raise BindingTypeError(
            f"{name} must hold real numbers (float32, or float16/float64/integers, converted to "
            f"float32), got dtype {arr.dtype}"
        )
    if arr.ndim != 2 or arr.shape[1] != d_model:
        hint = " (one token: x.reshape(1, -1))" if arr.ndim == 1 else ""
        raise BindingValueError(
            f"{name} must have shape (tokens, {d_model}) (the model's d_model), got shape "
            f"{tuple(arr.shape)}{hint}"
        )
    if arr.shape[0] > INT32_MAX:
        raise BindingValueError(f"{name} has {arr.shape[0]} tokens; at most {INT32_MAX}")
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ascontiguousarray(arr, dtype=np.float32)
    finite = np.isfinite(out)
    if not finite.all():
        where = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise BindingValueError(
            f"{name}{list(where)} is {arr[where].item()!r}"
            f"{' (beyond the float32 range)' if np.isfinite(arr[where]) else ''}: the runtime "
            f"needs finite activations"
        )
    return out


def check_token_ids(name: str, ids: object, vocab: int) -> list[int]:
    """A sequence (list, tuple, 1-D integer array) of token ids, each an integer in
    0..vocab - 1, as a list of ints."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise BindingTypeError(
                f"{name} must be a 1-D array of integers, got shape {ids.shape} dtype {ids.dtype}"
            )
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise BindingTypeError(f"{name} must be a sequence of token ids, got {ids!r}")
    return [check_int(f"{name}[{i}]", t, 0, vocab - 1) for i, t in enumerate(ids)]


def check_flag(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise BindingTypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


class RuntimeStatusError(ColibriError):
    """A C runtime call returned a negative colibri_status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Config(ctypes.Structure):
    _fields_ = [
        ("model_path", ctypes.c_char_p),
        ("cache_policy", ctypes.c_int),
        ("lru_cache_size", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
        ("load_flags", ctypes.c_uint32),  # COLIBRI_LOAD_*: 0 verifies checksums and NaN / Inf
        ("expert_sharing_map", ctypes.POINTER(ctypes.c_int32)),
    ]


class _Stats(ctypes.Structure):
    _fields_ = [
        ("loads", ctypes.c_uint64),
        ("hits", ctypes.c_uint64),
        ("misses", ctypes.c_uint64),
        ("evictions", ctypes.c_uint64),
    ]


class _ModelHead(ctypes.Structure):
    """The leading fields of colibri_model_t (stable order, see colibri.h)."""

    _fields_ = [
        ("n_experts", ctypes.c_int32),
        ("d_model", ctypes.c_int32),
        ("d_ff", ctypes.c_int32),
        ("top_k", ctypes.c_int32),
    ]


class _LMConfig(ctypes.Structure):
    """colibri_lm_config_t (colibri_lm.h)."""

    _fields_ = [
        ("model_path", ctypes.c_char_p),
        ("max_context", ctypes.c_int32),
        ("load_flags", ctypes.c_uint32),
        ("expert_ram_budget", ctypes.c_uint64),  # 0 = every expert read in place
        ("expert_flags", ctypes.c_uint32),  # COLIBRI_LM_NO_PREFETCH = 1, _NO_PIN = 2
        ("num_threads", ctypes.c_int32),  # 0 / 1 = the caller's thread only
        ("prefill_batch", ctypes.c_int32),  # 0 = 64 (sized to the budget with one)
        ("pinned_slots", ctypes.c_int32),  # 0 = auto
        ("max_memory", ctypes.c_uint64),  # 0 = no ceiling on colibri_lm_init's allocations
    ]


class _LMMemory(ctypes.Structure):
    """colibri_lm_memory_t (colibri_lm.h): what colibri_lm_init allocates, in bytes."""

    _fields_ = [
        ("table_bytes", ctypes.c_uint64),
        ("arena_bytes", ctypes.c_uint64),
        ("kv_bytes", ctypes.c_uint64),
        ("slot_bytes", ctypes.c_uint64),
        ("packed_bytes", ctypes.c_uint64),
        ("pool_bytes", ctypes.c_uint64),
        ("total_bytes", ctypes.c_uint64),
        ("max_context", ctypes.c_int32),
    ]


#: colibri_lm_config_t.expert_flags bits (colibri_lm.h).
LM_NO_PREFETCH = 0x1
LM_NO_PIN = 0x2
LM_NO_READ_CHECK = 0x4
LM_PREFETCH_ALWAYS = 0x8


def prefetch_flags(prefetch: object) -> int:
    """colibri_lm_config_t.expert_flags bits of a prefetch setting: True (the default: each
    layer's prediction read ahead once it proves right), False (none) or "always" (every
    prediction read ahead, for measurements)."""
    if prefetch == "always":
        return LM_PREFETCH_ALWAYS
    return 0 if check_flag("prefetch", prefetch) else LM_NO_PREFETCH


#: The largest pinned_slots (int32).
MAX_PIN = 2**31 - 1


def pin_setting(pin: int | str) -> tuple[int, int]:
    """(pinned_slots, expert_flags bit) of a pin request: "auto" (the default: up to half the
    slots, when the file has calibration heat), 0 (no pinning) or N > 0 (up to N slots)."""
    if pin == "auto":
        return 0, 0
    if isinstance(pin, int) and not isinstance(pin, bool) and 0 <= pin <= MAX_PIN:
        return (pin, 0) if pin > 0 else (0, LM_NO_PIN)
    raise BindingValueError(f"pin must be 'auto' or a slot count 0..{MAX_PIN}, got {pin!r}")


#: colibri_lm_stats_t field names, in order (colibri_lm.h).
LM_STATS_FIELDS = (
    "loads",
    "hits",
    "misses",
    "evictions",
    "prefetches",
    "prefetch_hits",
    "bytes_read",
    "expert_bytes",
    "slot_bytes",
)
#: ... and its fields after them.
LM_STATS_TAIL = (
    ("n_slots", ctypes.c_uint32),
    ("n_pinned", ctypes.c_uint32),
    ("pinned_hits", ctypes.c_uint64),
    ("bytes_prefetched", ctypes.c_uint64),
    ("prefetch_skipped", ctypes.c_uint64),
    ("restores", ctypes.c_uint64),
)


class _LMStats(ctypes.Structure):
    """colibri_lm_stats_t (colibri_lm.h)."""

    _fields_ = [
        *((name, ctypes.c_uint64) for name in LM_STATS_FIELDS),
        *LM_STATS_TAIL,
    ]


class _LMInfo(ctypes.Structure):
    """colibri_lm_info_t (colibri_lm.h)."""

    _fields_ = [
        ("vocab_size", ctypes.c_int32),
        ("d_model", ctypes.c_int32),
        ("n_layers", ctypes.c_int32),
        ("max_context", ctypes.c_int32),
        ("arena_bytes", ctypes.c_size_t),
        ("weight_bytes", ctypes.c_size_t),
        ("packed_bytes", ctypes.c_size_t),
    ]


def _sources() -> list[Path]:
    root = resource_dir() / "runtime_c"
    return (
        runtime_sources()
        + sorted((root / "include").glob("*.h"))
        + sorted((root / "src").glob("*.h"))
        + sorted((root / "arch").glob("*/*.h"))
    )


#: COLIBRI_SANITIZE values shared_library() accepts (a test builds the binding's library with
#: them and runs Python with the sanitizer runtime preloaded: tests/runtime/test_binding_asan.py).
SANITIZERS = ("", "address", "undefined", "address,undefined")


def _sanitize_flags() -> list[str]:
    san = os.environ.get("COLIBRI_SANITIZE", "")
    if san not in SANITIZERS:
        raise InputError(f"COLIBRI_SANITIZE={san!r}: one of {', '.join(map(repr, SANITIZERS))}")
    if not san:
        return []
    flags = [f"-fsanitize={san}", "-fno-omit-frame-pointer", "-g"]
    return flags + (["-fno-sanitize-recover=undefined"] if "undefined" in san else [])


def shared_library() -> Path:
    """Build (once) and return the path of libcolibri.so for this host (with COLIBRI_SANITIZE
    set, a sanitizer build of it, kept apart)."""
    srcs = _sources()
    san = _sanitize_flags()
    h = hashlib.sha256(" ".join(san).encode())
    for p in srcs:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    out = tools_dir() / "pybinding" / f"libcolibri-{h.hexdigest()[:16]}.so"
    if out.is_file():
        return out
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise ToolchainNotFound(f"C compiler '{cc}' not found; install gcc (apt-get install gcc)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    cmd = [
        cc,
        "-std=c11",
        "-O2",
        "-fPIC",
        "-shared",
        "-ffp-contract=off",
        "-Wall",
        "-Wextra",
        "-Werror",
        *san,
        "-I",
        str(resource_dir() / "runtime_c" / "include"),
        *[str(p) for p in srcs if p.suffix == ".c"],
        "-o",
        str(tmp),
        "-lm",
        "-pthread",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"building libcolibri.so failed:\n{proc.stderr[-3000:]}")
    os.replace(tmp, out)
    return out


_LIB: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(str(shared_library()))
        f32 = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
        i32 = np.ctypeslib.ndpointer(np.int32, flags="C_CONTIGUOUS")
        status, int32, handle = ctypes.c_int, ctypes.c_int32, ctypes.c_void_p
        handle_out = ctypes.POINTER(ctypes.c_void_p)
        logits_out = ctypes.POINTER(ctypes.POINTER(ctypes.c_float))
        signatures: dict[str, tuple[Any, list[Any]]] = {  # name: (restype, argtypes)
            "colibri_init": (status, [ctypes.POINTER(_Config), handle_out]),
            "colibri_cleanup": (None, [handle]),
            "colibri_strerror": (ctypes.c_char_p, [ctypes.c_int]),
            "colibri_forward": (status, [handle, f32, f32, int32, int32, int32, i32, f32, f32]),
            "colibri_get_stats": (status, [handle, ctypes.POINTER(_Stats)]),
            "colibri_lm_init": (status, [ctypes.POINTER(_LMConfig), handle_out]),
            "colibri_lm_measure": (status, [ctypes.POINTER(_LMConfig), ctypes.POINTER(_LMMemory)]),
            "colibri_lm_forward": (status, [handle, int32, int32, logits_out]),
            "colibri_lm_prefill": (
                status,
                [handle, ctypes.POINTER(int32), int32, int32, logits_out],
            ),
            "colibri_lm_info": (status, [handle, ctypes.POINTER(_LMInfo)]),
            "colibri_lm_get_stats": (status, [handle, ctypes.POINTER(_LMStats)]),
            "colibri_lm_free": (None, [handle]),
        }
        for name, (restype, argtypes) in signatures.items():
            getattr(lib, name).restype = restype
            getattr(lib, name).argtypes = argtypes
        _LIB = lib
    return _LIB


def strerror(status: int) -> str:
    return library().colibri_strerror(status).decode()


#: colibri_status COLIBRI_ERR_CONFIG; its C text names config.json, which a container has not.
ERR_CONFIG = -7
#: What COLIBRI_ERR_CONFIG means for a container file.
CONTAINER_CONFIG_WHY = (
    "the model config stored in the file has a field missing or out of range (a size, a head "
    "count, rms_norm_eps, rope_theta, ...); the file was written from an unchecked config: "
    "convert it again with this Colibri, which range-checks every field of the checkpoint's config"
)


def _is_container(path: bytes) -> bool:
    from ..frontends.container import MAGIC

    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def init_error(function: str, path: bytes, status: int) -> RuntimeStatusError:
    """The error of a failed colibri_init / colibri_lm_init on `path`: the C status text, but
    for a container COLIBRI_ERR_CONFIG says what is wrong (not "config.json missing")."""
    why = strerror(status)
    if status == ERR_CONFIG and _is_container(path):
        why = CONTAINER_CONFIG_WHY
    return RuntimeStatusError(status, f"{os.fsdecode(path)}: {function}: {why} ({status})")


_H = TypeVar("_H", bound="_Handle")


class _Handle:
    """A C object that this Python object owns: closed once, by close(), a with block's end or
    garbage collection; subclasses name the C function that frees it."""

    _handle: ctypes.c_void_p | None = None
    _lib: ctypes.CDLL

    def _free(self, handle: ctypes.c_void_p) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if self._handle is not None:
            self._free(self._handle)
            self._handle = None

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


#: colibri_status COLIBRI_ERR_EXPERT (an expert id out of range or a sharing map invalid).
_ERR_EXPERT = -12


def _map_length_error(given: int, n_experts: int) -> BindingValueError:
    return BindingValueError(
        f"sharing_map has {given} entries but the model has {n_experts} experts: pass one "
        f"entry per expert"
    )


class Runtime(_Handle):
    """A model loaded by the C runtime from a file (mmap, zero-copy)."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        cache_policy: str = "pinned",
        lru_cache_size: int = 0,
        sharing_map: list[int] | None = None,
    ) -> None:
        path = check_path("model_path", model_path)
        if not isinstance(cache_policy, str) or cache_policy not in CACHE_POLICIES:
            raise BindingValueError(
                f"cache_policy must be one of {', '.join(map(repr, CACHE_POLICIES))}, got "
                f"{cache_policy!r}"
            )
        lru = check_int("lru_cache_size", lru_cache_size, 0, MAX_LRU_SLOTS)
        if cache_policy == "lru" and lru < 1:
            raise BindingValueError(
                f"lru_cache_size must be in 1..{MAX_LRU_SLOTS} with cache_policy 'lru', got {lru}"
            )
        share: list[int] | None = None
        if sharing_map is not None:
            if isinstance(sharing_map, np.ndarray):
                sharing_map = sharing_map.tolist() if sharing_map.ndim == 1 else sharing_map
            if isinstance(sharing_map, (str, bytes)) or not isinstance(sharing_map, Sequence):
                raise BindingTypeError(
                    f"sharing_map must be a list of expert indices, got {sharing_map!r}"
                )
            if not 1 <= len(sharing_map) <= MAX_EXPERTS:
                raise BindingValueError(
                    f"sharing_map must have one entry per expert (1..{MAX_EXPERTS}), got "
                    f"{len(sharing_map)} entries"
                )
            share = [
                check_int(f"sharing_map[{i}]", v, 0, len(sharing_map) - 1)
                for i, v in enumerate(sharing_map)
            ]
            for i, j in enumerate(share):
                if share[j] != j:
                    raise BindingValueError(
                        f"sharing_map[{i}] = {j} but sharing_map[{j}] = {share[j]}: an expert "
                        f"must share the weights of one that keeps its own (sharing_map[j] = j)"
                    )
        lib = library()
        self._lib = lib
        # The C loader reads n_experts entries of the map, a number only the file knows: the
        # array is padded with -1 to the most experts a file can have, so a short map is read
        # inside the array and refused (COLIBRI_ERR_EXPERT), never past its end.
        self._share = None
        if share is not None:
            self._share = (ctypes.c_int32 * MAX_EXPERTS)(*share, *[-1] * (MAX_EXPERTS - len(share)))
        cfg = _Config(
            model_path=path,
            cache_policy=CACHE_POLICIES[cache_policy],
            lru_cache_size=lru,
            num_threads=1,
            load_flags=0,  # verify checksums and NaN / Inf
            expert_sharing_map=(
                ctypes.cast(self._share, ctypes.POINTER(ctypes.c_int32))
                if self._share is not None
                else None
            ),
        )
        handle = ctypes.c_void_p()
        st = lib.colibri_init(ctypes.byref(cfg), ctypes.byref(handle))
        if st != 0:
            if share is not None and st == _ERR_EXPERT:
                self._check_map_length(path, share)
            raise init_error("colibri_init", path, st)
        self._handle = handle
        head = ctypes.cast(handle, ctypes.POINTER(_ModelHead)).contents
        self.n_experts, self.d_model = head.n_experts, head.d_model
        self.d_ff, self.top_k = head.d_ff, head.top_k
        if share is not None and len(share) != self.n_experts:
            self.close()
            raise _map_length_error(len(share), self.n_experts)

    def _check_map_length(self, path: bytes, share: list[int]) -> None:
        """After COLIBRI_ERR_EXPERT with a sharing map: a map of the wrong length is named as
        such (the number of experts read by a second init without the map)."""
        handle = ctypes.c_void_p()
        cfg = _Config(model_path=path, cache_policy=2, lru_cache_size=0, num_threads=1)
        if self._lib.colibri_init(ctypes.byref(cfg), ctypes.byref(handle)) == 0:
            n = ctypes.cast(handle, ctypes.POINTER(_ModelHead)).contents.n_experts
            self._lib.colibri_cleanup(handle)
            if n != len(share):
                raise _map_length_error(len(share), n)

    def forward(
        self, x: np.ndarray, top_k: int | None = None, d_model: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Returns (output [T, d], expert_ids [T, k], gates [T, k]) of activations `x` of
        shape (T, d_model), T >= 0: float32, or real numbers converted to float32 (see
        :func:`check_activations`), all finite. `top_k`: 1..min(n_experts, 64), default the
        model's; `d_model`, if given, must be the model's. A bad argument raises
        BindingTypeError / BindingValueError before the C runtime is called."""
        if self._handle is None:
            raise InputError("model was closed")
        if d_model is not None:
            check_int("d_model", d_model, self.d_model, self.d_model)
        k = self.top_k if top_k is None else top_k
        k = check_int("top_k", k, 1, min(self.n_experts, MAX_TOP_K))
        x = check_activations("x", x, self.d_model)
        t = x.shape[0]
        y = np.zeros((t, self.d_model), np.float32)
        ids = np.zeros((t, k), np.int32)
        gates = np.zeros((t, k), np.float32)
        temp = np.zeros(max(t, 1), np.float32)
        st = self._lib.colibri_forward(self._handle, x, y, t, self.d_model, k, ids, gates, temp)
        if st != 0:
            raise RuntimeStatusError(st, f"colibri_forward: {strerror(st)} ({st})")
        return y, ids, gates

    def stats(self) -> dict[str, int]:
        if self._handle is None:
            raise InputError("model was closed")
        s = _Stats()
        st = self._lib.colibri_get_stats(self._handle, ctypes.byref(s))
        if st != 0:
            raise RuntimeStatusError(st, f"colibri_get_stats: {strerror(st)}")
        return {"loads": s.loads, "hits": s.hits, "misses": s.misses, "evictions": s.evictions}

    def _free(self, handle: ctypes.c_void_p) -> None:
        self._lib.colibri_cleanup(handle)


#: colibri_status COLIBRI_ERR_MEMORY: over the caller's colibri_lm_config_t.max_memory.
ERR_MEMORY = -18


def _lm_config(
    model_path: object,
    max_context: object,
    verify: object,
    ram_budget: object,
    prefetch: object,
    threads: object,
    prefill_batch: object,
    pin: int | str,
    max_memory: object,
    read_check: object = True,
) -> tuple[bytes, _LMConfig]:
    """The checked path and colibri_lm_config_t of LM's arguments (see LM)."""
    pinned, no_pin = pin_setting(pin)
    path = check_path("model_path", model_path)
    max_context = check_int("max_context", max_context, 0, INT32_MAX)
    ram_budget = check_int("ram_budget", ram_budget, 0, 2**64 - 1)
    threads = check_int("threads", threads, 0, MAX_THREADS)
    prefill_batch = check_int("prefill_batch", prefill_batch, 0, MAX_PREFILL_BATCH)
    max_memory = check_int("max_memory", max_memory, 0, 2**64 - 1)
    verify = check_flag("verify", verify)
    read_check = check_flag("read_check", read_check)
    return path, _LMConfig(
        model_path=path,
        max_context=max_context,
        load_flags=0 if verify else 3,  # COLIBRI_LOAD_SKIP_CHECKSUM | _SKIP_FINITE
        expert_ram_budget=ram_budget,
        expert_flags=prefetch_flags(prefetch) | no_pin | (0 if read_check else LM_NO_READ_CHECK),
        num_threads=threads,
        prefill_batch=prefill_batch,
        pinned_slots=pinned,
        max_memory=max_memory,
    )


def _lm_measure(cfg: _LMConfig) -> dict[str, int]:
    mem = _LMMemory()
    st = library().colibri_lm_measure(ctypes.byref(cfg), ctypes.byref(mem))
    if st != 0:
        raise init_error("colibri_lm_measure", cfg.model_path, st)
    return {field[0]: int(getattr(mem, field[0])) for field in _LMMemory._fields_}


def lm_memory(
    model_path: str | os.PathLike[str],
    max_context: int = 0,
    ram_budget: int = 0,
    threads: int = 0,
    prefill_batch: int = 0,
    max_memory: int = 0,
) -> dict[str, int]:
    """The bytes LM(model_path, ...) allocates with these options (colibri_lm_measure), by
    part: table_bytes, arena_bytes, kv_bytes (of the arena), slot_bytes, packed_bytes,
    pool_bytes, total_bytes, and the max_context they are for. Nothing beyond the file's tables
    is allocated. ``max_memory`` is not checked here, but it sizes the prefill chunk as LM's
    does (prefill_batch 0 with a budget)."""
    _, cfg = _lm_config(
        model_path, max_context, True, ram_budget, True, threads, prefill_batch, "auto", max_memory
    )
    return _lm_measure(cfg)


def memory_text(m: dict[str, int]) -> str:
    """One phrase: the total and its largest parts."""
    return (
        f"{m['total_bytes']} bytes (KV cache {m['kv_bytes']} for {m['max_context']} positions, "
        f"rest of the arena {m['arena_bytes'] - m['kv_bytes']}, tables {m['table_bytes']}, "
        f"expert slots {m['slot_bytes']}, packed matrices {m['packed_bytes']})"
    )


class LM(_Handle):
    """A whole model from a version-2 container (colibri_lm.h): the same logits as the
    generated C of the same model and quantisation, bit for bit, with no per-model build.

    ``ram_budget`` > 0 keeps at most that many bytes of routed experts resident (slots filled
    from the file, LRU, next-layer prefetch unless ``prefetch=False``, the hottest experts
    pinned when the file has calibration heat: ``pin`` "auto", 0 or a slot count, see
    :func:`pin_setting`): the same logits; :meth:`stats` counts hits, misses and bytes read.
    ``threads`` > 1 splits the large matrices and the experts of a layer over that many threads
    (a pool created here): the same logits bit for bit. ``prefill_batch``: tokens :meth:`prefill`
    runs through a layer together (0 = 64; with ``ram_budget``, as many as keep the chunk's
    activations within a quarter of the budget and under ``max_memory``, at least 64 where the
    ceiling allows: a chunk reads each expert once per layer). ``max_context``: KV cache positions
    (0 = 2048, or the file's maximum when smaller). ``max_memory`` > 0: a ceiling on the bytes the
    handle allocates (:func:`lm_memory` says how many it needs); over it, RuntimeStatusError -18
    naming the bytes needed, before they are allocated. ``read_check=False``: the experts read into
    slots under a budget are not checked against their CRC-32 (COLIBRI_LM_NO_READ_CHECK;
    ``verify=False`` turns off both this and the load-time checks)."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        max_context: int = 0,
        verify: bool = True,
        ram_budget: int = 0,
        prefetch: bool | str = True,
        threads: int = 0,
        prefill_batch: int = 0,
        pin: int | str = "auto",
        max_memory: int = 0,
        read_check: bool = True,
    ) -> None:
        path, cfg = _lm_config(
            model_path,
            max_context,
            verify,
            ram_budget,
            prefetch,
            threads,
            prefill_batch,
            pin,
            max_memory,
            read_check,
        )
        lib = library()
        self._lib = lib
        handle = ctypes.c_void_p()
        st = lib.colibri_lm_init(ctypes.byref(cfg), ctypes.byref(handle))
        if st == ERR_MEMORY:
            need = _lm_measure(cfg)
            raise RuntimeStatusError(
                st,
                f"{os.fsdecode(path)}: colibri_lm_init: the model needs {memory_text(need)}, "
                f"over max_memory {cfg.max_memory} bytes; raise max_memory, or lower "
                f"max_context (the KV cache), threads or prefill_batch ({st})",
            )
        if st != 0:
            raise init_error("colibri_lm_init", path, st)
        self._handle = handle
        self._filled = 0  # positions 0..filled - 1 of the KV cache hold this sequence
        info = _LMInfo()
        lib.colibri_lm_info(handle, ctypes.byref(info))
        self.vocab_size, self.d_model = info.vocab_size, info.d_model
        self.n_layers, self.max_context = info.n_layers, info.max_context
        self.arena_bytes = int(info.arena_bytes)
        #: bytes of the matrices repacked at init for the CPU's kernels (0: none)
        self.packed_bytes = int(info.packed_bytes)

    def _check_pos(self, pos: object) -> int:
        """A position to run next: 0..max_context - 1 and no later than the first position
        not yet run (the KV cache holds 0..filled - 1: a later one would attend to positions
        never computed; an earlier one rewinds, and the positions after it are dropped)."""
        pos = check_int("pos", pos, 0, self.max_context - 1)
        if pos > self._filled:
            raise BindingValueError(
                f"pos must be in 0..{self._filled}, got {pos}: positions 0..{pos - 1} must be "
                f"run first (the KV cache holds {self._filled} positions; run the tokens in "
                f"order, or prefill them)"
            )
        return pos

    def forward(self, token: int, pos: int) -> np.ndarray:
        """The next-token logits [vocab] (a copy) after `token` (0..vocab - 1) at position
        `pos`: 0..max_context - 1, at most one past the last position run (a smaller one
        rewinds)."""
        if self._handle is None:
            raise InputError("model was closed")
        token = check_int("token", token, 0, self.vocab_size - 1)
        pos = self._check_pos(pos)
        out = ctypes.POINTER(ctypes.c_float)()
        st = self._lib.colibri_lm_forward(self._handle, token, pos, ctypes.byref(out))
        if st != 0:
            self._filled = min(self._filled, pos)
            raise RuntimeStatusError(st, f"colibri_lm_forward: {strerror(st)} ({st})")
        self._filled = pos + 1
        return np.ctypeslib.as_array(out, shape=(self.vocab_size,)).copy()

    def prefill(self, ids: list[int], pos: int = 0) -> np.ndarray:
        """The next-token logits [vocab] (a copy) after `ids` at positions pos, pos + 1, ...
        run as batches (colibri_lm_prefill): those of the last forward() of a token loop.
        `ids`: at least one id, each 0..vocab - 1; pos + len(ids) <= max_context."""
        if self._handle is None:
            raise InputError("model was closed")
        ids = check_token_ids("ids", ids, self.vocab_size)
        if not ids:
            raise BindingValueError("ids is empty: pass at least one token id")
        pos = self._check_pos(pos)
        if pos + len(ids) > self.max_context:
            raise BindingValueError(
                f"context overflow: pos {pos} + {len(ids)} ids = {pos + len(ids)} positions, "
                f"but this handle's max_context is {self.max_context}"
            )
        arr = (ctypes.c_int32 * len(ids))(*ids)
        out = ctypes.POINTER(ctypes.c_float)()
        st = self._lib.colibri_lm_prefill(self._handle, arr, len(ids), pos, ctypes.byref(out))
        if st != 0:
            self._filled = min(self._filled, pos)
            raise RuntimeStatusError(st, f"colibri_lm_prefill: {strerror(st)} ({st})")
        self._filled = pos + len(ids)
        return np.ctypeslib.as_array(out, shape=(self.vocab_size,)).copy()

    def logits(self, ids: list[int]) -> np.ndarray:
        """Logits [T, vocab] of every position of `ids` (at least one), from position 0."""
        ids = check_token_ids("ids", ids, self.vocab_size)
        if not ids:
            raise BindingValueError("ids is empty: pass at least one token id")
        if len(ids) > self.max_context:
            raise BindingValueError(
                f"context overflow: {len(ids)} ids, but this handle's max_context is "
                f"{self.max_context}"
            )
        return np.stack([self.forward(int(t), p) for p, t in enumerate(ids)])

    def generate(self, prompt: list[int], max_new: int) -> tuple[np.ndarray, list[int]]:
        """(prompt logits [T, vocab], max_new greedy ids: argmax, ties to the lower id);
        len(prompt) + max_new - 1 positions must fit max_context."""
        prompt = check_token_ids("prompt", prompt, self.vocab_size)
        max_new = check_int("max_new", max_new, 0, INT32_MAX)
        if len(prompt) + max(max_new - 1, 0) > self.max_context:
            raise BindingValueError(
                f"context overflow: {len(prompt)} prompt ids + {max_new} new tokens need "
                f"{len(prompt) + max(max_new - 1, 0)} positions, but this handle's max_context "
                f"is {self.max_context}"
            )
        logits = self.logits(prompt)
        row, out = logits[-1], []
        for i in range(max_new):
            out.append(int(np.argmax(row)))
            if i + 1 < max_new:
                row = self.forward(out[-1], len(prompt) + i)
        return logits, out

    def stats(self) -> dict[str, int]:
        """Expert-slot counters (colibri_lm_stats_t): loads, hits, misses, evictions,
        prefetches, prefetch_hits, bytes_read, expert_bytes, slot_bytes, n_slots, n_pinned,
        pinned_hits, bytes_prefetched, prefetch_skipped, restores."""
        if self._handle is None:
            raise InputError("model was closed")
        s = _LMStats()
        st = self._lib.colibri_lm_get_stats(self._handle, ctypes.byref(s))
        if st != 0:
            raise RuntimeStatusError(st, f"colibri_lm_get_stats: {strerror(st)}")
        names = (*LM_STATS_FIELDS, *(name for name, _ in LM_STATS_TAIL))
        return {name: int(getattr(s, name)) for name in names}

    def _free(self, handle: ctypes.c_void_p) -> None:
        self._lib.colibri_lm_free(handle)
