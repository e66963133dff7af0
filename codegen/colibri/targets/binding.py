"""Python binding of the C runtime (ctypes + numpy), for services and for tests of the
runtime's file-loading paths: :class:`Runtime` (colibri_init on a container or a seed-layout
file, mmap'ed: one MoE block) and :class:`LM` (colibri_lm_init on a whole-model container,
version 2: token steps, logits and greedy generation, no per-model build).

The shared library is built from runtime_c/src with the host's C compiler on first use and
cached under the tools directory, keyed by a hash of the sources.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..errors import BuildError, ColibriError, InputError, ToolchainNotFound
from ..paths import resource_dir, tools_dir

CACHE_POLICIES = {"none": 0, "lru": 1, "pinned": 2}


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
        ("prefill_batch", ctypes.c_int32),  # 0 = 64 tokens per prefill chunk
        ("pinned_slots", ctypes.c_int32),  # 0 = auto
    ]


#: colibri_lm_config_t.expert_flags bits (colibri_lm.h).
LM_NO_PREFETCH = 0x1
LM_NO_PIN = 0x2
#: The largest pinned_slots (int32).
MAX_PIN = 2**31 - 1


def pin_setting(pin: int | str) -> tuple[int, int]:
    """(pinned_slots, expert_flags bit) of a pin request: "auto" (the default: up to half the
    slots, when the file has calibration heat), 0 (no pinning) or N > 0 (up to N slots)."""
    if pin == "auto":
        return 0, 0
    if isinstance(pin, int) and not isinstance(pin, bool) and 0 <= pin <= MAX_PIN:
        return (pin, 0) if pin > 0 else (0, LM_NO_PIN)
    raise InputError(f"pin must be 'auto' or a slot count 0..{MAX_PIN}, got {pin!r}")


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
        sorted((root / "src").glob("*.c"))
        + sorted((root / "include").glob("*.h"))
        + sorted((root / "src").glob("*.h"))
    )


def shared_library() -> Path:
    """Build (once) and return the path of libcolibri.so for this host."""
    srcs = _sources()
    h = hashlib.sha256()
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


class Runtime(_Handle):
    """A model loaded by the C runtime from a file (mmap, zero-copy)."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        cache_policy: str = "pinned",
        lru_cache_size: int = 0,
        sharing_map: list[int] | None = None,
    ) -> None:
        lib = library()
        self._lib = lib
        self._share = (ctypes.c_int32 * len(sharing_map))(*sharing_map) if sharing_map else None
        cfg = _Config(
            model_path=str(model_path).encode(),
            cache_policy=CACHE_POLICIES[cache_policy],
            lru_cache_size=lru_cache_size,
            num_threads=1,
            load_flags=0,  # verify checksums and NaN / Inf
            expert_sharing_map=(
                ctypes.cast(self._share, ctypes.POINTER(ctypes.c_int32)) if self._share else None
            ),
        )
        handle = ctypes.c_void_p()
        st = lib.colibri_init(ctypes.byref(cfg), ctypes.byref(handle))
        if st != 0:
            raise RuntimeStatusError(st, f"{model_path}: colibri_init: {strerror(st)} ({st})")
        self._handle = handle
        head = ctypes.cast(handle, ctypes.POINTER(_ModelHead)).contents
        self.n_experts, self.d_model = head.n_experts, head.d_model
        self.d_ff, self.top_k = head.d_ff, head.top_k

    def forward(
        self, x: np.ndarray, top_k: int | None = None, d_model: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Returns (output [T, d], expert_ids [T, k], gates [T, k])."""
        if self._handle is None:
            raise InputError("model was closed")
        x = np.ascontiguousarray(x, dtype=np.float32)
        t = x.shape[0]
        k = self.top_k if top_k is None else top_k
        kk = max(k, 1)
        y = np.zeros((t, self.d_model), np.float32)
        ids = np.zeros((t, kk), np.int32)
        gates = np.zeros((t, kk), np.float32)
        temp = np.zeros(max(t, 1), np.float32)
        st = self._lib.colibri_forward(
            self._handle,
            x,
            y,
            t,
            self.d_model if d_model is None else d_model,
            k,
            ids,
            gates,
            temp,
        )
        if st != 0:
            raise RuntimeStatusError(st, f"colibri_forward: {strerror(st)} ({st})")
        return y, ids, gates

    def stats(self) -> dict[str, int]:
        s = _Stats()
        st = self._lib.colibri_get_stats(self._handle, ctypes.byref(s))
        if st != 0:
            raise RuntimeStatusError(st, f"colibri_get_stats: {strerror(st)}")
        return {"loads": s.loads, "hits": s.hits, "misses": s.misses, "evictions": s.evictions}

    def _free(self, handle: ctypes.c_void_p) -> None:
        self._lib.colibri_cleanup(handle)


class LM(_Handle):
    """A whole model from a version-2 container (colibri_lm.h): the same logits as the
    generated C of the same model and quantisation, bit for bit, with no per-model build.

    ``ram_budget`` > 0 keeps at most that many bytes of routed experts resident (slots filled
    from the file, LRU, next-layer prefetch unless ``prefetch=False``, the hottest experts
    pinned when the file has calibration heat: ``pin`` "auto", 0 or a slot count, see
    :func:`pin_setting`): the same logits; :meth:`stats` counts hits, misses and bytes read.
    ``threads`` > 1 splits the large matrices and the experts of a layer over that many threads
    (a pool created here): the same logits bit for bit. ``prefill_batch``: tokens
    :meth:`prefill` runs through a layer together (0 = 64)."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        max_context: int = 0,
        verify: bool = True,
        ram_budget: int = 0,
        prefetch: bool = True,
        threads: int = 0,
        prefill_batch: int = 0,
        pin: int | str = "auto",
    ) -> None:
        pinned, no_pin = pin_setting(pin)
        lib = library()
        self._lib = lib
        if not 0 <= ram_budget < 2**64:
            raise InputError(f"ram_budget must be between 0 and 2**64 - 1, got {ram_budget}")
        cfg = _LMConfig(
            model_path=str(model_path).encode(),
            max_context=max_context,
            load_flags=0 if verify else 3,  # COLIBRI_LOAD_SKIP_CHECKSUM | _SKIP_FINITE
            expert_ram_budget=ram_budget,
            expert_flags=(0 if prefetch else LM_NO_PREFETCH) | no_pin,
            num_threads=threads,
            prefill_batch=prefill_batch,
            pinned_slots=pinned,
        )
        handle = ctypes.c_void_p()
        st = lib.colibri_lm_init(ctypes.byref(cfg), ctypes.byref(handle))
        if st != 0:
            raise RuntimeStatusError(st, f"{model_path}: colibri_lm_init: {strerror(st)} ({st})")
        self._handle = handle
        info = _LMInfo()
        lib.colibri_lm_info(handle, ctypes.byref(info))
        self.vocab_size, self.d_model = info.vocab_size, info.d_model
        self.n_layers, self.max_context = info.n_layers, info.max_context
        self.arena_bytes = int(info.arena_bytes)
        #: bytes of the matrices repacked at init for the CPU's kernels (0: none)
        self.packed_bytes = int(info.packed_bytes)

    def forward(self, token: int, pos: int) -> np.ndarray:
        """The next-token logits [vocab] (a copy) after `token` at position `pos`."""
        if self._handle is None:
            raise InputError("model was closed")
        out = ctypes.POINTER(ctypes.c_float)()
        st = self._lib.colibri_lm_forward(self._handle, token, pos, ctypes.byref(out))
        if st != 0:
            raise RuntimeStatusError(st, f"colibri_lm_forward: {strerror(st)} ({st})")
        return np.ctypeslib.as_array(out, shape=(self.vocab_size,)).copy()

    def prefill(self, ids: list[int], pos: int = 0) -> np.ndarray:
        """The next-token logits [vocab] (a copy) after `ids` at positions pos, pos + 1, ...
        run as batches (colibri_lm_prefill): those of the last forward() of a token loop."""
        if self._handle is None:
            raise InputError("model was closed")
        arr = (ctypes.c_int32 * max(len(ids), 1))(*[int(t) for t in ids])
        out = ctypes.POINTER(ctypes.c_float)()
        st = self._lib.colibri_lm_prefill(self._handle, arr, len(ids), pos, ctypes.byref(out))
        if st != 0:
            raise RuntimeStatusError(st, f"colibri_lm_prefill: {strerror(st)} ({st})")
        return np.ctypeslib.as_array(out, shape=(self.vocab_size,)).copy()

    def logits(self, ids: list[int]) -> np.ndarray:
        """Logits [T, vocab] of every position of `ids`, from position 0."""
        return np.stack([self.forward(int(t), p) for p, t in enumerate(ids)])

    def generate(self, prompt: list[int], max_new: int) -> tuple[np.ndarray, list[int]]:
        """(prompt logits [T, vocab], max_new greedy ids: argmax, ties to the lower id)."""
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
        pinned_hits."""
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
