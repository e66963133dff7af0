"""A random-weight int4 model file (.clb version 2) of any Mixtral-like shape, written straight
from a seeded generator, for models larger than the RAM (issue 41 item 7: a Mixtral-8x7B
shape, about 26 GB), and its decode under an expert RAM budget measured.

No float checkpoint is made and no layer's fp32 weights exist: every matrix is drawn as what
`colibri convert --quant int4 --dense-quant int4` stores (int4 blocks of 32 along the input,
18 bytes each: an fp16 scale and 16 bytes of nibbles, the nibble + 8 convention, the last
block's padding the zero code), a few MiB of rows at a time, its CRC-32 taken as it passes.
The tensors, their order, names, shapes, layer descriptors and metadata are those that
`colibri convert` writes for a Mixtral with these flags (routed experts int4 with int8
activations, the attention projections, embedding and LM head int4, routers fp32, RMS norm
weights ones), so the runtime and `colibri reference F.clb` read it like any converted file.

* **Values.** A block's codes are uniform in -8..7 and its scale is drawn per block: a random
  sign (so the weights have mean zero) times a magnitude uniform in [0.5, 1.5) of a base chosen
  so that the matrix's weights have the standard deviation of a fan-in ("LeCun") init,
  ``gain / sqrt(n_in)`` (Mixtral-8x7B's q / k / v / w1 / w3: 0.0156, near transformers' 0.02),
  with the projections that write into the residual stream (attention ``o``, experts' ``w2``)
  scaled by a further ``1 / sqrt(2 x layers)`` (GPT-2's init) and the embedding's standard
  deviation 1: a scale-free init, so every shape (the test's tiny one too) behaves as the big
  one. Measured on a 256-wide, 32-layer model with Mixtral-8x7B's ratios (ff 3.5 x hidden,
  8 experts top-2, 48 random tokens, the numpy mirror): the tokens' hidden states stay apart
  (mean cosine 0.03 at the last layer) and every layer's picks are near uniform (normalised
  entropy of the picks 0.95 or more, at least 18 of the 28 pairs of experts used); with
  transformers' 0.02 everywhere scaled to that width (1.28 / sqrt(n_in), embedding 0.02) the
  cosine is 0.10, the entropy 0.86 or more and at least 16 pairs, also not degenerate, but
  the fixed 0.02 at the tiny width (80) gave 50 of its third layer's 64 picks to 2 experts.
  The routers are normal with standard deviation 1 / sqrt(hidden), so a router logit over the
  normed hidden state has a standard deviation of about 1 (the test checks the spread on the
  tiny shape). RMS norm weights are ones, the RoPE tables those
  `convert` computes; the activations stay finite (logits' standard deviation about 1).
* **Reproducible.** Each tensor has its own generators, seeded by (``--seed``, the tensor's
  index, stream): the file is a function of the shape and the seed only, byte for byte.
* **Streamed.** The tensor table's size is known before any weight is drawn (the count of
  tensors), so the data is written in place after the header, each blob at its aligned offset,
  and the header and table (with the CRCs) are written last over the reserved space: no spool
  file, no second copy of the data on disk, the bytes :func:`colibri.emit.container.container_image`
  gives for the same tensors. Written data is flushed and dropped from the page cache every
  ``FLUSH_BYTES`` so the writer does not fill the page cache; the writer's memory is a chunk
  of rows (``CHUNK_BYTES``) plus the RoPE tables.

``--run BUDGET`` then decodes with the prebuilt model-file runner (one compute thread, default
flags, the file evicted from the page cache first) under GNU time: tokens/s of the decode loop
(``COLIBRI_TIMING``), wall time of the whole run (load: the CRC check of every tensor reads the
file once), hit rate, bytes of experts read per token (prompt and generated), peak RSS, bytes
read from storage. ``--run 0`` runs with every expert resident; ``--compare`` checks that every
run generated the same ids (and, with ``--logits``, the same prompt logits, bit for bit).

    python benchmarks/big_container.py OUT.clb [--shape mixtral-8x7b|5g|tiny] [--hidden N] ...
        [--seed 0] [--gain 1] [--max-context 64] [--no-write] [--run 8G[,0] [--compare]
        [--logits] [--prompt 8] [--tokens 16]] [--json F]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "codegen"))

from colibri.frontends.container import (  # noqa: E402
    ACT_CODES,
    ALIGN,
    BLOCK_Q4_DTYPE,
    DTYPE_CODES,
    DTYPE_Q4,
    ENTRY_SIZE,
    EXPERT_COLUMNS,
    HEADER_SIZE,
    LAYER_DESC,
    NO_EXPERT,
    QK4,
    SCHEME_CODES,
    align,
    pack_entry,
    q4_blocks,
)
from colibri.ir.moe import FLAG_GATED, FLAG_NORM_TOPK  # noqa: E402
from colibri.ir.transformer import MoETransformer, TransformerConfig  # noqa: E402
from colibri.quant.model import TransformerQuant  # noqa: E402

#: Shapes: Mixtral-8x7B (hidden 4096, intermediate 14336, 32 layers, 8 experts top-2, 32 / 8
#: heads of 128, vocab 32000: about 26 GB in int4); one of about 5.3 GB (offsets past 32 bits
#: with little disk); a tiny one with odd sizes (padded blocks, hidden != heads x head_dim).
SHAPES: dict[str, dict[str, int]] = {
    "mixtral-8x7b": dict(
        hidden=4096,
        ff=14336,
        layers=32,
        experts=8,
        top_k=2,
        heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=32000,
    ),
    "5g": dict(
        hidden=2048,
        ff=7168,
        layers=26,
        experts=8,
        top_k=2,
        heads=16,
        kv_heads=4,
        head_dim=128,
        vocab=32000,
    ),
    "tiny": dict(
        hidden=80,
        ff=136,
        layers=3,
        experts=8,
        top_k=2,
        heads=4,
        kv_heads=2,
        head_dim=16,
        vocab=300,
    ),
}
#: The weights' standard deviation is GAIN / sqrt(n_in) (the residual projections' a further
#: 1 / sqrt(2 x layers)); the embedding's EMBED_STD.
GAIN = 1.0
EMBED_STD = 1.0
ROPE_THETA = 1e6
RMS_EPS = 1e-5
#: Rows of a matrix drawn at once: about this many bytes of blocks.
CHUNK_BYTES = 8 << 20
#: Written data is flushed and dropped from the page cache every this many bytes.
FLUSH_BYTES = 512 << 20
#: E[c^2] of codes uniform in -8..7, and E[m^2] of a magnitude uniform in [0.5, 1.5).
CODE_MEAN_SQUARE = sum(c * c for c in range(-8, 8)) / 16.0
MAGNITUDE_MEAN_SQUARE = 13.0 / 12.0
#: The runner's timing line (COLIBRI_TIMING=1, runtime_c/runner/lmfile_main.c).
TIMING = re.compile(r"colibri: timing: prefill (\d+) tokens (\d+) ns, decode (\d+) tokens (\d+) ns")
TIME = "/usr/bin/time"


@dataclass(frozen=True)
class Shape:
    hidden: int
    ff: int
    layers: int
    experts: int
    top_k: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    def check(self) -> None:
        for name, v in self.__dict__.items():
            if v < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
        if self.top_k > self.experts:
            raise ValueError(f"--top-k {self.top_k} exceeds --experts {self.experts}")
        if self.heads % self.kv_heads or self.head_dim % 2:
            raise ValueError("--heads must be a multiple of --kv-heads, --head-dim even")

    def config(self) -> TransformerConfig:
        return TransformerConfig(
            architecture="MixtralForCausalLM",
            vocab_size=self.vocab,
            d_model=self.hidden,
            n_layers=self.layers,
            n_heads=self.heads,
            n_kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            rope_theta=ROPE_THETA,
            rms_norm_eps=RMS_EPS,
        )


def int4_bytes(n_out: int, n_in: int) -> int:
    return n_out * q4_blocks(n_in) * BLOCK_Q4_DTYPE.itemsize


@dataclass(frozen=True)
class Spec:
    """One tensor to write: its table entry and how its bytes are drawn (`kind`: "int4"
    matrix [out, in], "normal" f32 of standard deviation `std`, "ones" f32, "rope.cos" /
    "rope.sin", or "i32" with fixed `values`)."""

    name: str
    kind: str
    shape: tuple[int, ...]
    expert: int = NO_EXPERT
    std: float = 0.0
    values: tuple[int, ...] = ()

    @property
    def dtype(self) -> int:
        if self.kind == "int4":
            return DTYPE_Q4
        return DTYPE_CODES[np.dtype("<i4" if self.kind == "i32" else "<f4")]

    @property
    def nbytes(self) -> int:
        if self.kind == "int4":
            return int4_bytes(*self.shape)
        return 4 * math.prod(self.shape)


def specs(s: Shape, max_context: int, gain: float = GAIN) -> list[Spec]:
    """Every tensor of the file in `colibri convert`'s order (colibri.emit.lmfile's
    head_tensors, layer_tensors, tail_tensors) for a Mixtral quantised --quant int4
    --dense-quant int4 (router fp32, no shared expert, no heat, no tokenizer), with the
    standard deviation of its values (the module's "Values")."""
    d, hq, hkv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    half = s.head_dim // 2
    residual = 1.0 / math.sqrt(2 * s.layers)

    def std(n_in: int, scale: float = 1.0) -> float:
        return gain * scale / math.sqrt(n_in)

    out = [
        Spec("embed", "int4", (s.vocab, d), std=EMBED_STD),
        Spec("lm_head", "int4", (s.vocab, d), std=std(d)),
        Spec("final_norm", "ones", (d,)),
        Spec("rope.cos", "rope.cos", (max_context, half)),
        Spec("rope.sin", "rope.sin", (max_context, half)),
    ]
    int4, int8 = SCHEME_CODES["int4"], ACT_CODES["int8"]
    for i in range(s.layers):
        p = f"layer.{i}"
        out += [Spec(f"{p}.input_norm", "ones", (d,)), Spec(f"{p}.post_norm", "ones", (d,))]
        for short, shape in (("q", (hq, d)), ("k", (hkv, d)), ("v", (hkv, d))):
            out.append(Spec(f"{p}.attn.{short}", "int4", shape, std=std(d)))
        out.append(Spec(f"{p}.attn.o", "int4", (d, hq), std=std(hq, residual)))
        out.append(Spec(f"{p}.router", "normal", (s.experts, d), std=1.0 / math.sqrt(d)))
        table = tuple(v for j in range(s.experts) for v in (j, int4, int8))
        out.append(Spec(f"{p}.experts", "i32", (s.experts, len(EXPERT_COLUMNS)), values=table))
        for j in range(s.experts):
            e = f"{p}.expert.{j}"
            out.append(Spec(f"{e}.w1", "int4", (s.ff, d), j, std(d)))
            out.append(Spec(f"{e}.w2", "int4", (d, s.ff), j, std(s.ff, residual)))
            out.append(Spec(f"{e}.w3", "int4", (s.ff, d), j, std(d)))
        desc = dict.fromkeys(LAYER_DESC, 0)
        desc.update(is_moe=1, n_experts=s.experts, top_k=s.top_k, d_ff=s.ff)
        desc["moe_flags"] = FLAG_GATED | FLAG_NORM_TOPK  # SwiGLU, top-k gates renormalised
        desc["router_scheme"] = SCHEME_CODES["fp32"]
        out.append(Spec(f"{p}.desc", "i32", (len(LAYER_DESC),), values=tuple(desc.values())))
    return out


def _rngs(seed: int, index: int) -> tuple[np.random.Generator, np.random.Generator]:
    """The tensor's two streams (codes; scales or values), independent of how it is chunked."""
    a, b = np.random.SeedSequence([seed, index]).spawn(2)
    return np.random.default_rng(a), np.random.default_rng(b)


def int4_chunks(
    n_out: int, n_in: int, std: float, codes: np.random.Generator, scales: np.random.Generator
) -> Iterator[np.ndarray]:
    """BLOCK_Q4_DTYPE rows [rows, blocks] of a random int4 matrix [n_out, n_in], a few MiB at a
    time: codes uniform in -8..7 (nibble + 8; the last block's padding the zero code 8), scales
    a random sign times a magnitude uniform in [0.5, 1.5) of a base giving standard deviation
    `std`, rounded to fp16."""
    nb = q4_blocks(n_in)
    base = std / math.sqrt(CODE_MEAN_SQUARE * MAGNITUDE_MEAN_SQUARE)
    rows = max(1, CHUNK_BYTES // (nb * BLOCK_Q4_DTYPE.itemsize))
    pad = nb * QK4 - n_in  # zero codes at the end of each row's last block
    for r0 in range(0, n_out, rows):
        r = min(rows, n_out - r0)
        out = np.empty((r, nb), BLOCK_Q4_DTYPE)
        raw = codes.bit_generator.random_raw(r * nb * (QK4 // 2) // 8)  # 64 bits a draw
        qs = raw.view(np.uint8).reshape(r, nb, QK4 // 2)
        if pad:
            # value i of a block is qs[i] & 15 for i < 16, qs[i - 16] >> 4 for i >= 16
            for i in range(QK4 - pad, QK4):
                if i < 16:
                    qs[:, -1, i] = (qs[:, -1, i] & 0xF0) | 8
                else:
                    qs[:, -1, i - 16] = (qs[:, -1, i - 16] & 0x0F) | 0x80
        out["qs"] = qs
        u = scales.random(r * nb, dtype=np.float32)
        mag = np.float32(0.5) + np.float32(2.0) * np.mod(u, np.float32(0.5))
        d = np.where(u < np.float32(0.5), np.float32(-base), np.float32(base)) * mag
        out["d"] = d.astype(np.float16).view(np.uint16).reshape(r, nb)
        yield out


def tensor_chunks(spec: Spec, seed: int, index: int, s: Shape) -> Iterator[np.ndarray]:
    """The bytes of tensor `index` (its spec), in chunks."""
    if spec.kind == "int4":
        codes, scales = _rngs(seed, index)
        yield from int4_chunks(spec.shape[0], spec.shape[1], spec.std, codes, scales)
    elif spec.kind == "normal":
        _, values = _rngs(seed, index)
        yield (values.standard_normal(spec.shape) * spec.std).astype("<f4")
    elif spec.kind == "ones":
        yield np.ones(spec.shape, "<f4")
    elif spec.kind in ("rope.cos", "rope.sin"):
        from colibri.reference.transformer import rope_tables

        cos, sin = rope_tables(s.config(), np.arange(spec.shape[0]))
        t = cos if spec.kind == "rope.cos" else sin
        yield np.ascontiguousarray(t[:, : spec.shape[1]].astype("<f4"))
    elif spec.kind == "i32":
        yield np.asarray(spec.values, "<i4").reshape(spec.shape)
    else:
        raise ValueError(f"unknown tensor kind {spec.kind}")


def head_meta(s: Shape, max_context: int) -> tuple[bytes, Callable[..., bytes]]:
    """The metadata and header packer `colibri convert` writes for this shape and flags."""
    from colibri.emit.lmfile import lm_meta_header

    model = MoETransformer(
        s.config(), np.zeros((0,)), [], np.zeros((0,)), np.zeros((0,)), "big_container.py"
    )
    q = TransformerQuant("int4", "int8", {}, "int4", "int8", router_scheme="fp32")
    return lm_meta_header(model, q, max_context)


def file_size(s: Shape, max_context: int) -> int:
    """Bytes of the file, from the shape alone."""
    all_specs = specs(s, max_context)
    meta, _ = head_meta(s, max_context)
    cursor = align(HEADER_SIZE + ENTRY_SIZE * len(all_specs) + len(meta))
    for sp in all_specs[:-1]:
        cursor = align(cursor + sp.nbytes)
    return cursor + all_specs[-1].nbytes


def write_tensors(
    f: BinaryIO,
    s: Shape,
    max_context: int,
    seed: int,
    gain: float = GAIN,
    log: Callable[[str], None] | None = None,
) -> int:
    """Write the file to `f` (seekable, empty): the data in place after the space of the
    header, table and metadata, then those; returns the file size."""
    all_specs = specs(s, max_context, gain)
    meta, header = head_meta(s, max_context)
    meta_offset = HEADER_SIZE + ENTRY_SIZE * len(all_specs)
    data_offset = align(meta_offset + len(meta))
    fd = f.fileno()
    f.seek(data_offset)
    pos = data_offset
    flushed = 0
    entries: list[bytes] = []
    t0 = time.monotonic()
    for index, sp in enumerate(all_specs):
        pad = -pos % ALIGN
        if pad:
            f.write(bytes(pad))
            pos += pad
        offset, crc, n = pos, 0, 0
        for chunk in tensor_chunks(sp, seed, index, s):
            view = chunk.reshape(-1).view(np.uint8).data
            crc = zlib.crc32(view, crc)
            f.write(view)
            n += view.nbytes
        if n != sp.nbytes:
            raise AssertionError(f"{sp.name}: wrote {n} bytes, expected {sp.nbytes}")
        pos += n
        entries.append(pack_entry(sp.name, sp.dtype, sp.shape, offset, n, sp.expert, crc))
        if pos - flushed >= FLUSH_BYTES:  # keep the page cache for the readers
            f.flush()
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, pos, os.POSIX_FADV_DONTNEED)
            flushed = pos
            if log is not None:
                rate = (pos >> 20) / max(time.monotonic() - t0, 1e-9)
                log(f"  {pos / 1e9:6.2f} GB written ({rate:.0f} MiB/s), {sp.name}")
    head = header(len(all_specs), HEADER_SIZE, meta_offset, data_offset, pos)
    head += b"".join(entries) + meta
    head += bytes(data_offset - len(head))
    f.seek(0)
    f.write(head)
    f.flush()
    return pos


def write_file(
    path: Path,
    s: Shape,
    max_context: int,
    seed: int,
    gain: float = GAIN,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Write the file atomically (colibri.paths.write_file_atomic: a temporary sibling, then a
    rename); a full disk is an OutputError naming the bytes needed."""
    from colibri.paths import write_file_atomic

    def write(f: BinaryIO) -> None:
        write_tensors(f, s, max_context, seed, gain, log)

    return write_file_atomic(path, write, file_size(s, max_context))


def image_bytes(s: Shape, max_context: int, seed: int, gain: float = GAIN) -> bytearray:
    """The same file through colibri.emit.container.container_image (in memory: tiny shapes;
    the test's check that the in-place writer gives the planned image's bytes)."""
    from colibri.emit.container import TableEntry, byte_view, container_image

    entries = []
    for index, sp in enumerate(specs(s, max_context, gain)):
        data = b"".join(bytes(byte_view(c)) for c in tensor_chunks(sp, seed, index, s))
        entries.append(TableEntry(sp.name, data, sp.dtype, sp.shape, sp.expert))
    meta, header = head_meta(s, max_context)
    return container_image(entries, meta, header).tobytes()


# -- the decode under a budget ----------------------------------------------------------------


def run_budget(
    runner: Path,
    clb: Path,
    budget: int,
    prompt: list[int],
    tokens: int,
    work: Path,
    logits: bool = False,
    timeout: float | None = None,
) -> dict[str, Any]:
    """One run of the model-file runner (one thread, default flags) with the file evicted from
    the page cache first, under GNU time; with `logits` the prompt's logits are asked too (the
    prompt then runs a token at a time) and their SHA-256 kept."""
    from colibri.targets.lmrun import (
        SamplingOptions,
        lmfile_args,
        parse_expert_stats,
        read_lm_output,
        write_lm_input,
    )

    work.mkdir(parents=True, exist_ok=True)
    write_lm_input(work / "input.bin", prompt, tokens, SamplingOptions(), logits)
    fd = os.open(clb, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    tfile = work / "time"
    cmd = [TIME, "-f", "%M %I %F %e", "-o", str(tfile), str(runner)]
    cmd += lmfile_args(clb.resolve(), ram_budget=budget, threads=1)
    env = dict(os.environ, COLIBRI_TIMING="1")
    load = os.getloadavg()[0]
    try:
        proc = subprocess.run(
            cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"budget_bytes": budget, "exit": -1, "error": f"timed out after {timeout} s"}
    got: dict[str, Any] = {"budget_bytes": budget, "exit": proc.returncode, "load_before": load}
    got["load_after"] = os.getloadavg()[0]
    if proc.returncode != 0:
        got["error"] = (proc.stdout + proc.stderr)[-800:]
        return got
    fields = tfile.read_text().split()
    rss_kib, blocks, majors = (int(x) for x in fields[-4:-1])
    got.update(
        peak_rss_bytes=rss_kib * 1024,
        read_bytes=blocks * 512,
        major_faults=majors,
        wall_s=float(fields[-1]),
    )
    m = TIMING.search(proc.stdout)
    if m is not None:
        p_n, p_ns, d_n, d_ns = (int(g) for g in m.groups())
        got.update(prefill_tokens=p_n, prefill_s=p_ns * 1e-9, decode_tokens=d_n)
        got["decode_s"] = d_ns * 1e-9
        got["decode_tokens_per_s"] = d_n / (d_ns * 1e-9) if d_ns else 0.0
    stats = parse_expert_stats(proc.stdout)
    if stats is not None:
        got["stats"] = stats
        got["hit_rate"] = stats["hits"] / stats["loads"] if stats["loads"] else 0.0
        got["expert_bytes_read_per_token"] = stats["bytes_read"] / (len(prompt) + tokens)
    out = read_lm_output(work / "output.bin", tokens)
    got["ids"] = [int(i) for i in out.tokens]
    if out.logits is not None:
        got["logits_sha256"] = hashlib.sha256(out.logits.tobytes()).hexdigest()
        got["logits_std"] = float(out.logits.std())
    return got


def parse_size(text: str) -> int:
    """'8G' / '512M' / '0' -> bytes (binary suffixes K, M, G, T)."""
    m = re.fullmatch(r"(\d+)([KMGT]?)", text.strip(), re.IGNORECASE)
    if m is None:
        raise ValueError(f"a size such as 8G, 512M or 0, not {text!r}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2).upper()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the .clb to write (or to run, with --no-write)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="mixtral-8x7b")
    for name in Shape.__dataclass_fields__:
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, help="overrides the --shape's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gain", type=float, default=GAIN, help="weights' std x sqrt(fan-in)")
    ap.add_argument("--max-context", type=int, default=64)
    ap.add_argument("--no-write", action="store_true", help="run an existing file")
    ap.add_argument("--run", help="expert RAM budgets to decode with, e.g. 8G or 8G,0")
    ap.add_argument("--prompt", type=int, default=8, help="prompt tokens")
    ap.add_argument("--tokens", type=int, default=16, help="generated tokens")
    ap.add_argument(
        "--compare", action="store_true", help="the runs' ids (and logits) must be equal"
    )
    ap.add_argument("--logits", action="store_true", help="ask the prompt's logits too")
    ap.add_argument("--timeout", type=float, help="seconds a run may take (default: no limit)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    sizes = dict(SHAPES[args.shape])
    for name in Shape.__dataclass_fields__:
        if getattr(args, name) is not None:
            sizes[name] = getattr(args, name)
    shape = Shape(**sizes)
    try:
        shape.check()
    except ValueError as e:
        ap.error(str(e))

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    report: dict[str, Any] = {"shape": shape.__dict__, "seed": args.seed, "gain": args.gain}
    report["max_context"] = args.max_context
    if not args.no_write:
        size = file_size(shape, args.max_context)
        log(f"writing {args.out}: {size / 1e9:.2f} GB ({len(specs(shape, 1))} tensors)")
        t0 = time.monotonic()
        write_file(args.out, shape, args.max_context, args.seed, args.gain, log)
        dt = time.monotonic() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        report["writer"] = {"seconds": dt, "peak_rss_bytes": rss, "file_bytes": size}
        rate = size / dt / 1e6
        log(f"wrote {size / 1e9:.2f} GB in {dt:.1f} s ({rate:.0f} MB/s), peak RSS {rss >> 20} MiB")
    report["file_bytes"] = args.out.stat().st_size
    if args.run:
        from colibri.targets.lmrun import lmfile_runner

        runner = lmfile_runner("host")
        prompt = [(7 * i + 1) % shape.vocab for i in range(args.prompt)]
        runs = []
        with tempfile.TemporaryDirectory(prefix="big-container-") as tmp:
            for k, text in enumerate(args.run.split(",")):
                budget = parse_size(text)
                log(f"run: budget {budget} bytes, {args.prompt} prompt + {args.tokens} tokens")
                work = Path(tmp) / str(k)
                got = run_budget(
                    runner, args.out, budget, prompt, args.tokens, work, args.logits, args.timeout
                )
                runs.append(got)
                log(json.dumps({k: v for k, v in got.items() if k != "ids"}))
        report["runs"] = runs
        same = {(tuple(r.get("ids", ())), r.get("logits_sha256")) for r in runs}
        if args.compare and len(same) != 1:
            log("the runs generated different ids or logits")
            return 1
        if any("error" in r for r in runs):
            return 1
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
