"""The runners' file protocols: a generated transformer run on a board (tokens in and out), and
at the end of this file the MoE-layer runner's (runtime_c/runner/main.c: rows in, output and
routing out).

runtime_c/runner/lm_main.c reads ``input.bin`` (prompt ids and sampling options) and writes
``output.bin`` (the logits of every prompt position when asked, then the generated ids). The
prompt plus the new tokens must fit the KV cache (``--max-context`` at generation time):
:func:`run_lm` refuses an overflowing request with :class:`~colibri.errors.InputError` before
anything runs, and the firmware refuses it again (exit status 4) rather than overrun memory.

``--prompt TEXT`` is tokenized with, in order: ``--tokenizer FILE``, the ``tokenizer.json`` of the
checkpoint the model was generated from (``manifest["model"]["source"]``), or, for a
vocabulary of >= 256 ids, one token per UTF-8 byte (:func:`byte_tokens`). The tokenizer (any
Hugging Face tokenizer.json, read by the ``tokenizers`` library: :mod:`colibri.frontends.tokenizer`)
also decodes the generated ids for printing.
"""

from __future__ import annotations

import re
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ColibriError, InputError, ModelFormatError
from ..progress import SILENT, Progress

if TYPE_CHECKING:
    from ..frontends.tokenizer import Tokenizer

IN_MAGIC = 0x4C424C43  # "CLBL"
OUT_MAGIC = 0x47424C43  # "CLBG"
FLAG_LOGITS = 0x1
#: Exit status of the runner when the request does not fit the KV cache.
EXIT_CONTEXT_OVERFLOW = 4


#: The largest --temperature (the CLI's range; also refuses inf, whose softmax is NaN).
MAX_TEMPERATURE = 10000.0


@dataclass(frozen=True)
class SamplingOptions:
    """Greedy when temperature is 0; top_k 0 keeps every token; top_p 1 cuts nothing."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def check(self, vocab: int) -> None:
        if (
            not 0.0 <= self.temperature <= MAX_TEMPERATURE
            or not 0.0 < self.top_p <= 1.0
            or not 0 <= self.top_k < 2**31
        ):
            raise InputError(
                f"sampling needs 0 <= --temperature <= {MAX_TEMPERATURE:g}, 0 < --top-p <= 1 "
                f"and --top-k >= 0; got "
                f"temperature={self.temperature}, top_p={self.top_p}, top_k={self.top_k}"
            )
        if not 0 <= self.seed < 2**64:
            raise InputError(f"--seed must be between 0 and 2**64 - 1, got {self.seed}")
        if self.top_k > vocab:
            raise InputError(f"--top-k {self.top_k} exceeds the vocabulary ({vocab} tokens)")


@dataclass
class LMOutput:
    tokens: np.ndarray  # [max_new] int32, the generated ids
    logits: np.ndarray | None  # [n_prompt, vocab] float32 when asked
    #: the model-file runner's expert-slot counters with a RAM budget (colibri_lm_stats_t)
    expert_stats: dict[str, int] | None = None


def parse_ids(text: str) -> list[int]:
    """'1,5,9' (or '1 5 9') -> [1, 5, 9]. Every comma-separated item must be one decimal
    integer (ASCII digits, an optional minus: the vocabulary check names a negative id); an
    empty item ('1,,2', a trailing comma) or anything else is an InputError naming the item."""
    if not text.strip():
        raise InputError("--prompt-ids is empty: pass at least one token id, e.g. 1,5,9")
    items = text.split(",") if "," in text else text.split()
    ids = []
    for i, item in enumerate(items, 1):
        word = item.strip()
        if not word:
            raise InputError(
                f"--prompt-ids {text!r}: item {i} is empty; pass comma-separated integers such "
                f"as 1,5,9 (no empty items, no trailing comma)"
            )
        if not _ID.fullmatch(word):
            raise InputError(
                f"--prompt-ids {text!r}: item {i} is {word!r}, not an integer; pass "
                f"comma-separated integers such as 1,5,9"
            )
        ids.append(int(word))
    return ids


#: One token id of --prompt-ids: ASCII decimal digits (int() would also take '1_0', ' ٢ ').
_ID = re.compile(r"-?[0-9]+")


def check_request(
    manifest: dict[str, Any],
    prompt: list[int],
    max_new: int,
    regenerate: str = "regenerate with a larger --max-context",
) -> None:
    """Ids in the vocabulary and prompt + new tokens within the KV cache (else InputError)."""
    cfg = manifest["model"]["config"]
    vocab = int(cfg["vocab_size"])
    ctx = int(manifest["memory"]["max_context"])
    if not prompt:
        raise InputError("the prompt is empty: pass at least one token id")
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise InputError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
    if max_new < 0:
        raise InputError(f"--max-new-tokens must be >= 0, got {max_new}")
    if len(prompt) + max_new > ctx:
        raise InputError(
            f"context overflow: {len(prompt)} prompt + {max_new} new tokens = "
            f"{len(prompt) + max_new} positions, but the model was made with --max-context "
            f"{ctx}; pass fewer tokens or {regenerate}"
        )


def write_lm_input(
    path: Path, prompt: list[int], max_new: int, sampling: SamplingOptions, logits: bool
) -> None:
    hdr = struct.pack(
        "<4IfifII",
        IN_MAGIC,
        len(prompt),
        max_new,
        FLAG_LOGITS if logits else 0,
        sampling.temperature,
        sampling.top_k,
        sampling.top_p,
        sampling.seed & 0xFFFFFFFF,
        sampling.seed >> 32,
    )
    path.write_bytes(hdr + np.asarray(prompt, "<i4").tobytes())


def read_lm_output(path: Path, max_new: int) -> LMOutput:
    if not path.is_file():
        raise ColibriError(f"{path}: the runner wrote no output file")
    raw = path.read_bytes()
    if len(raw) < 16:
        raise ColibriError(f"{path}: output file truncated ({len(raw)} bytes)")
    magic, vocab, n_prompt, rows = struct.unpack_from("<4I", raw)
    if magic != OUT_MAGIC:
        raise ColibriError(f"{path}: not a text-generation output file (magic 0x{magic:08X})")
    need = 16 + 4 * (rows * vocab + max_new)
    if len(raw) != need:
        raise ColibriError(f"{path}: {len(raw)} bytes, expected {need}; the run stopped early")
    logits = None
    if rows:
        logits = np.frombuffer(raw, "<f4", rows * vocab, 16).reshape(rows, vocab).copy()
    tokens = np.frombuffer(raw, "<i4", max_new, 16 + 4 * rows * vocab).astype(np.int32)
    return LMOutput(tokens, logits)


def run_lm(
    gen_dir: str | Path,
    board_name: str,
    prompt: list[int],
    max_new: int,
    sampling: SamplingOptions | None = None,
    want_logits: bool = False,
    count_instructions: bool = False,
    timeout: float | None = None,
    verbose: bool = False,
    progress: Progress = SILENT,
) -> tuple[LMOutput, Any]:
    """Build (incrementally) and run a generated transformer; returns (LMOutput, RunResult)."""
    from ..boards import load_board
    from ..emit.output import manifest_kind
    from .build import build_model, check_generated
    from .qemu import run_elf

    gdir = Path(gen_dir).resolve()
    manifest = check_generated(gdir)
    if manifest_kind(manifest) != "transformer":
        raise InputError(
            f"{gdir}: a single MoE layer, not a whole transformer; run it with --input X.npy, "
            f"or generate a Hugging Face checkpoint without --layer"
        )
    sampling = sampling or SamplingOptions()
    sampling.check(int(manifest["model"]["config"]["vocab_size"]))
    check_request(manifest, prompt, max_new)
    board = load_board(board_name)
    exe = build_model(gdir, board.name, verbose=verbose, progress=progress)
    with tempfile.TemporaryDirectory(prefix="colibri-lm-") as tmp:
        work = Path(tmp)
        write_lm_input(work / "input.bin", prompt, max_new, sampling, want_logits)
        with progress.stage("run"):
            result = run_elf(
                board, exe, cwd=work, timeout=timeout, count_instructions=count_instructions
            )
        out = read_lm_output(work / "output.bin", max_new)
    return out, result


#: Exit status of the model-file runner when colibri_lm_init refuses the file: 10 + -status.
EXIT_RUNTIME_ERROR = 10
#: ... when the expert RAM budget holds fewer than top_k experts (COLIBRI_ERR_BUDGET, -17).
EXIT_BUDGET = EXIT_RUNTIME_ERROR + 17
#: ... for a bad argument (COLIBRI_ERR_ARG, -1): --pin N on a file without expert heat.
EXIT_ARG = EXIT_RUNTIME_ERROR + 1
#: ... when the model needs more than --max-memory (COLIBRI_ERR_MEMORY, -18).
EXIT_MEMORY = EXIT_RUNTIME_ERROR + 18
#: The runner's line before that exit (runtime_c/runner/lmfile_main.c, colibri_lm_measure).
_MEMORY_RE = re.compile(r"colibri: memory needed: (?P<what>.*)$", re.MULTILINE)
#: The runner's expert-slot line (runtime_c/runner/lmfile_main.c) with a RAM budget.
_STATS_RE = re.compile(
    r"expert slots: (?P<n_slots>\d+) x (?P<slot_bytes>\d+) bytes, loads (?P<loads>\d+) "
    r"hits (?P<hits>\d+) misses (?P<misses>\d+) evictions (?P<evictions>\d+) "
    r"prefetches (?P<prefetches>\d+) prefetch hits (?P<prefetch_hits>\d+) "
    r"bytes read (?P<bytes_read>\d+) pinned (?P<n_pinned>\d+) pinned hits (?P<pinned_hits>\d+) "
    r"bytes ahead (?P<bytes_prefetched>\d+) skipped (?P<prefetch_skipped>\d+)"
    r"(?: restores (?P<restores>\d+))?"
)


def parse_expert_stats(stdout: str) -> dict[str, int] | None:
    """The counters of the runner's "expert slots: ..." line, or None without one."""
    m = _STATS_RE.search(stdout)
    return {k: int(v) for k, v in m.groupdict().items() if v is not None} if m else None


def format_expert_stats(s: dict[str, int]) -> str:
    """One line: slots, hit rate, prefetch hits, bytes read."""
    rate = s["hits"] / s["loads"] if s["loads"] else 0.0
    return (
        f"colibri: expert slots: {s['n_slots']} x {s['slot_bytes']} bytes; {s['loads']} loads, "
        f"{s['hits']} hits ({rate:.1%}), {s['misses']} misses, {s['evictions']} evictions, "
        f"{s['prefetches']} prefetches, {s['prefetch_hits']} prefetch hits, "
        f"{s['n_pinned']} pinned ({s['pinned_hits']} hits), {s['bytes_read']} bytes read "
        f"({s['bytes_prefetched']} ahead), {s['prefetch_skipped']} predictions skipped, "
        f"{s.get('restores', 0)} restores"
    )


def is_container_file(path: str | Path) -> bool:
    """Whether `path` is a file that starts like a Colibri container (any version)."""
    from ..frontends.container import MAGIC

    p = Path(path)
    if not p.is_file():
        return False
    try:
        with open(p, "rb") as f:
            return f.read(8) == MAGIC
    except OSError:
        return False


def lm_file_manifest(path: str | Path) -> dict[str, Any]:
    """What `colibri run` needs of a whole-model container, in a generated manifest's shape:
    model.source / config.vocab_size (tokenizer lookup) and memory.max_context."""
    from ..frontends.container import read_lm_header

    h, meta = read_lm_header(path)
    return {
        "kind": "transformer-file",
        "model": {
            "source": str(meta.get("source") or ""),
            "config": {"vocab_size": int(h["vocab_size"])},
        },
        "memory": {"max_context": int(h["max_context"])},
    }


def lmfile_runner(board_name: str, verbose: bool = False) -> Path:
    """The model-file runner of a board (runtime_c/runner/lmfile_main.c), built once by SCons
    (incrementally afterwards) under the build directory's lmfile-<board>/; no per-model build."""
    from ..boards import load_board
    from ..paths import resource_dir
    from .build import _fail, require_toolchain, scons

    board = load_board(board_name)
    if board.is_baremetal or not board.has_mmap:
        raise InputError(
            f"board {board.name} has no file system: a .clb model file runs on the host and "
            f"Linux boards; for an MCU generate C (`colibri generate CKPT --board {board.name}`)"
        )
    require_toolchain(board)
    bdir = (resource_dir() / "build" / f"lmfile-{board.name}").resolve()
    proc = scons([f"board={board.name}", f"build_dir={bdir}", "lmfile=1"], verbose)
    if proc.returncode != 0:
        _fail(proc, f"building the model-file runner for {board.name}")
    return bdir / "lmfile" / "colibri_lmfile"


def lmfile_args(
    model: str | Path = "model.clb",
    request: str | Path = "input.bin",
    output: str | Path = "output.bin",
    *,
    max_context: int = 0,
    ram_budget: int = 0,
    flags: int = 0,
    threads: int = 0,
    prefill_batch: int = 0,
    pinned: int = 0,
    max_memory: int = 0,
) -> tuple[str, ...]:
    """The model-file runner's arguments after the program name (runtime_c/runner/lmfile_main.c
    reads them by position): paths, then colibri_lm_config_t's max_context, expert_ram_budget,
    expert_flags, num_threads, prefill_batch, pinned_slots and max_memory (0 = the runtime's
    default each). The one place that knows the order: run_lm_file, the benchmarks and the
    sanitizer tests."""
    values = (max_context, ram_budget, flags, threads, prefill_batch, pinned, max_memory)
    return (str(model), str(request), str(output), *(str(int(v)) for v in values))


def _runner_failure(
    result: Any, path: Path, ram_budget: int, pinned: int, max_memory: int = 0
) -> ColibriError | None:
    """The error of a model-file runner that exited non-zero (None when it exited 0): a
    budget / pin the runtime refused is an InputError saying which option to change, another
    runtime status (exit 10 + -status) a ModelFormatError with the runner's last `colibri:`
    line, any other exit (a bad request: context overflow, token ids) an InputError with its
    last line."""
    from .binding import CONTAINER_CONFIG_WHY, ERR_CONFIG

    code = result.returncode
    if code == EXIT_MEMORY:
        m = _MEMORY_RE.search(result.stdout or "")
        need = m.group("what") if m else "more"
        return InputError(
            f"{path}: the model needs {need}, over --max-memory {max_memory} bytes; pass a "
            f"larger --max-memory, or a smaller --max-context (the KV cache) or --threads"
        )
    if code == EXIT_BUDGET and pinned:
        return InputError(
            f"{path}: --ram-budget {ram_budget} bytes holds fewer than top_k routed experts "
            f"of a layer beside --pin {pinned} pinned ones; pass a larger budget or a "
            f"smaller --pin (or --pin auto)"
        )
    if code == EXIT_ARG and pinned:
        return InputError(
            f"{path}: --pin {pinned} needs the experts' calibration heat, which this file "
            f"does not hold; re-convert with --calib IDS.npy, or pass --pin auto or 0"
        )
    if code == EXIT_BUDGET:
        return InputError(
            f"{path}: --ram-budget {ram_budget} bytes holds fewer than top_k routed experts "
            f"of a layer; pass a larger budget (or 0: every expert resident)"
        )
    if code == EXIT_RUNTIME_ERROR - ERR_CONFIG:  # not "config.json missing": a container
        return ModelFormatError(f"{path}: {CONTAINER_CONFIG_WHY}")
    if code >= EXIT_RUNTIME_ERROR:
        lines = [ln for ln in (result.stdout or "").splitlines() if ln.startswith("colibri:")]
        why = lines[-1][len("colibri: ") :] if lines else f"exit code {code}"
        return ModelFormatError(f"{path}: {why}")
    if code != 0:
        said = (result.stdout or "").strip().splitlines()
        return InputError(f"{path}: {said[-1] if said else code}")
    return None


def run_lm_file(
    model_file: str | Path,
    board_name: str,
    prompt: list[int],
    max_new: int,
    sampling: SamplingOptions | None = None,
    want_logits: bool = False,
    count_instructions: bool = False,
    timeout: float | None = None,
    verbose: bool = False,
    ram_budget: int = 0,
    prefetch: bool | str = True,
    threads: int = 0,
    pin: int | str = "auto",
    max_context: int = 0,
    max_memory: int = 0,
) -> tuple[LMOutput, Any]:
    """Run a whole-model container (.clb version 2) on a board with the prebuilt model-file
    runner; returns (LMOutput, RunResult). ``max_context``: the KV cache's positions (0 = the
    request's, prompt + new tokens; above the file's maximum, or below the request's, an
    InputError); ``max_memory`` > 0: a ceiling on the runtime's allocations (over it, an
    InputError naming the bytes needed). A file the runtime refuses is a ModelFormatError
    with the runtime's one-line reason. ``ram_budget`` > 0: at most that many bytes of routed
    experts resident (colibri_lm_config_t.expert_ram_budget; the same outputs), the counters
    in LMOutput.expert_stats; a budget below top_k experts is an InputError. ``pin``: the
    hottest experts pinned in slots ("auto", 0 = none, N = up to N; binding.pin_setting).
    ``threads`` > 1 splits the work over that many threads (colibri_lm_config_t.num_threads; the
    same outputs). Without ``want_logits`` the prompt is prefilled in batches
    (colibri_lm_prefill)."""
    from ..boards import load_board
    from .binding import pin_setting, prefetch_flags
    from .qemu import run_elf

    path = Path(model_file).resolve()
    manifest = lm_file_manifest(path)
    sampling = sampling or SamplingOptions()
    sampling.check(int(manifest["model"]["config"]["vocab_size"]))
    check_request(manifest, prompt, max_new, regenerate="re-convert with a larger --max-context")
    board = load_board(board_name)
    if not 0 <= ram_budget < 2**64:
        raise InputError(f"--ram-budget must be between 0 and 2**64 - 1, got {ram_budget}")
    if not 0 <= threads <= 256:
        raise InputError(f"--threads must be between 0 and 256, got {threads}")
    need = len(prompt) + max_new
    file_ctx = int(manifest["memory"]["max_context"])
    if max_context and not need <= max_context <= file_ctx:
        raise InputError(
            f"--max-context {max_context}: must be between the request's {need} positions "
            f"({len(prompt)} prompt + {max_new} new tokens) and the file's {file_ctx}"
        )
    max_context = max_context or need
    if not 0 <= max_memory < 2**64:
        raise InputError(f"--max-memory must be between 0 and 2**64 - 1, got {max_memory}")
    pinned, no_pin = pin_setting(pin)
    flags = prefetch_flags(prefetch) | no_pin
    exe = lmfile_runner(board.name, verbose=verbose)
    with tempfile.TemporaryDirectory(prefix="colibri-lmfile-") as tmp:
        work = Path(tmp)
        (work / "model.clb").symlink_to(path)
        write_lm_input(work / "input.bin", prompt, max_new, sampling, want_logits)
        result = run_elf(
            board,
            exe,
            cwd=work,
            timeout=timeout,
            count_instructions=count_instructions,
            check=False,
            args=lmfile_args(
                max_context=max_context,
                ram_budget=ram_budget,
                flags=flags,
                threads=threads,
                pinned=pinned,
                max_memory=max_memory,
            ),
        )
        failure = _runner_failure(result, path, ram_budget, pinned, max_memory)
        if failure is not None:
            raise failure
        out = read_lm_output(work / "output.bin", max_new)
    if ram_budget > 0:
        out.expert_stats = parse_expert_stats(result.stdout or "")
    return out, result


def byte_tokens(text: str, vocab: int) -> list[int]:
    """The byte-level tokenizer: one token per UTF-8 byte, id = byte value."""
    if vocab < 256:
        raise InputError(
            f"--prompt needs a tokenizer: without --tokenizer FILE or a tokenizer.json in the "
            f"checkpoint directory, the text is encoded one token per UTF-8 byte, which needs a "
            f"vocabulary of >= 256 ids; this model has {vocab}: pass --prompt-ids instead, or "
            f"--tokenizer with the checkpoint's tokenizer.json (Hugging Face)"
        )
    try:
        ids = list(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InputError("--prompt is not valid Unicode text (lone surrogates)") from None
    if not ids:
        raise InputError("--prompt is empty: pass at least one character")
    return ids


def byte_text(ids: np.ndarray | list[int]) -> str:
    """Generated ids as text under the byte-level tokenizer (ids >= 256 and invalid UTF-8 show
    as U+FFFD)."""
    raw = bytes(int(t) if 0 <= int(t) < 256 else 0xFF for t in ids)
    return raw.decode("utf-8", errors="replace")


def format_ids(ids: np.ndarray | list[int]) -> str:
    """Token ids space-separated on one line."""
    return " ".join(str(int(t)) for t in ids)


def checkpoint_tokenizer(manifest: dict[str, Any]) -> Path | None:
    """The tokenizer.json next to the checkpoint the model was generated from, if it is there
    (a relative source path is taken from the current directory, as `colibri generate` was)."""
    source = str(manifest.get("model", {}).get("source") or "")
    if not source or source == "(in memory)":
        return None
    ckpt = Path(source)
    path = (ckpt if ckpt.is_dir() else ckpt.parent) / "tokenizer.json"
    return path if path.is_file() else None


def resolve_tokenizer(manifest: dict[str, Any], explicit: str | None) -> Tokenizer | None:
    """--tokenizer FILE, else the checkpoint's tokenizer.json, else None; ConfigError /
    ModelFormatError when the file is missing, corrupt or unsupported or has ids outside the
    model's vocabulary."""
    from ..frontends.tokenizer import load_tokenizer

    path = Path(explicit) if explicit is not None else checkpoint_tokenizer(manifest)
    if path is None:
        return None
    tok = load_tokenizer(path)
    tok.check_vocab(int(manifest["model"]["config"]["vocab_size"]), "the generated model")
    return tok


# -- the MoE-layer runner's file protocol (runtime_c/runner/main.c): token input, output + routing
LAYER_IN_MAGIC = 0x49424C43  # "CLBI"
LAYER_OUT_MAGIC = 0x4F424C43  # "CLBO"


@dataclass
class RunOutput:
    output: np.ndarray  # [T, d] float32
    expert_ids: np.ndarray  # [T, k] int32
    gates: np.ndarray  # [T, k] float32


def write_input(path: Path, x: np.ndarray) -> None:
    t, d = x.shape
    path.write_bytes(
        struct.pack("<III", LAYER_IN_MAGIC, t, d) + np.ascontiguousarray(x, "<f4").tobytes()
    )


def read_output(path: Path) -> RunOutput:
    if not path.is_file():
        raise ColibriError(f"{path}: the runner wrote no output file")
    raw = path.read_bytes()
    if len(raw) < 20:
        raise ColibriError(f"{path}: output file truncated ({len(raw)} bytes)")
    magic, t, d, k, chunk = struct.unpack_from("<5I", raw)
    if magic != LAYER_OUT_MAGIC:
        raise ColibriError(f"{path}: not a runner output file (magic 0x{magic:08X})")
    out = np.empty((t, d), np.float32)
    ids = np.empty((t, k), np.int32)
    gates = np.empty((t, k), np.float32)
    off = 20
    done = 0
    while done < t:
        n = min(chunk, t - done)
        need = n * (d + 2 * k) * 4
        if off + need > len(raw):
            raise ColibriError(f"{path}: output file truncated after {done} tokens")
        out[done : done + n] = np.frombuffer(raw, "<f4", n * d, off).reshape(n, d)
        off += n * d * 4
        ids[done : done + n] = np.frombuffer(raw, "<i4", n * k, off).reshape(n, k)
        off += n * k * 4
        gates[done : done + n] = np.frombuffer(raw, "<f4", n * k, off).reshape(n, k)
        off += n * k * 4
        done += n
    return RunOutput(out, ids, gates)
