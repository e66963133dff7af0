"""Accuracy of the generated C per quantisation scheme on a trained checkpoint, against
transformers' fp32 model on held-out text.

For each scheme row (fp32; --quant int8; --quant int8 --dense-quant int8; --quant int4; --quant
int4 --dense-quant int8; and each quantised one again with --calib when a calibration file is
given) the whole transformer is generated with the colibri pipeline (--max-context = the
window), built for --board, and run teacher-forced on every held-out window with the logits of
every prompt position (the runner's FLAG_LOGITS, as `colibri run --logits`). Columns:

  C top-1       next-token choices (argmax) equal to transformers' at every position of every
                window (colibri.reference.lm_metrics.top1_agreement)
  C ppl, ratio  perplexity of the windows' next tokens under the C logits, and / transformers'
  mirror ...    the same of the numpy mirror (colibri.reference.transformer.forward with the
                scheme's TransformerQuant): C and mirror should agree (max |C - mirror| logit)
  flash         the built firmware's flash bytes (code + weights; the whole ELF on the host)
  weights       the generated weights' bytes (manifest)

Held-out text: --text FILE (tokenized with the checkpoint's tokenizer.json, or --tokenizer) or
--ids FILE.npy (token ids); default the checkpoint's heldout.txt. --windows evenly spaced,
non-overlapping windows of --window tokens (lm_metrics.token_windows). --calib FILE.npy holds
held-in token ids for the calibrated rows.

    python benchmarks/accuracy_table.py --checkpoint tests/data/trained_moe \
        [--text FILE | --ids FILE.npy] [--windows 8 --window 96] [--board host|cortex-m7] \
        [--schemes fp32 int8 int8+d8 int4 int4+d8 int4+d4 q4k q5k ...] [--calib FILE.npy]
        [--work DIR]

The functions are importable (tests/quant/test_trained_accuracy.py uses them).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "codegen") not in sys.path:
    sys.path.insert(0, str(ROOT / "codegen"))

from colibri.boards import load_board  # noqa: E402
from colibri.cli.argtypes import add_board_argument  # noqa: E402
from colibri.cli.pipeline import generate as generate_c  # noqa: E402
from colibri.cli.pipeline import quantise_transformer  # noqa: E402
from colibri.errors import ColibriError, InputError  # noqa: E402
from colibri.frontends.hf_model import load_hf_transformer  # noqa: E402
from colibri.ir.transformer import MoETransformer  # noqa: E402
from colibri.options import GenerateOptions  # noqa: E402
from colibri.quant.model import TransformerQuant  # noqa: E402
from colibri.reference.lm_metrics import (  # noqa: E402
    max_abs_diff,
    perplexity,
    perplexity_ratio,
    token_windows,
    top1_agreement,
)
from colibri.reference.transformer import forward  # noqa: E402
from colibri.targets.build import build_model  # noqa: E402
from colibri.targets.lmrun import SamplingOptions, read_lm_output, write_lm_input  # noqa: E402
from colibri.targets.qemu import run_elf  # noqa: E402
from colibri.targets.size import size_report  # noqa: E402

DEFAULT_WINDOWS = 8
DEFAULT_WINDOW = 96


@dataclass(frozen=True)
class Scheme:
    """One row: what `colibri generate` is asked (--quant, --dense-quant, --calib or not)."""

    key: str
    quant: str = "fp32"
    dense: str = "fp32"
    calib: bool = False

    @property
    def flags(self) -> str:
        parts = [f"--quant {self.quant}"] if self.quant != "fp32" else []
        if self.dense != "fp32":
            parts.append(f"--dense-quant {self.dense}")
        if self.calib:
            parts.append("--calib")
        return " ".join(parts) or "fp32"

    def with_calib(self) -> Scheme:
        return Scheme(f"{self.key}+calib", self.quant, self.dense, True)


_BASE = [
    Scheme("fp32"),
    Scheme("int8", "int8"),
    Scheme("int8+d8", "int8", "int8"),
    Scheme("int4", "int4"),
    Scheme("int4+d8", "int4", "int8"),
]
#: Rows measured only when named (--schemes): q4k / q5k routed experts (issue 38), and 4- / 5-bit
#: dense matrices (issue 41 item 5: +d4 --dense-quant int4, +dq4k / +dq5k q4k / q5k).
_EXTRA = [
    Scheme("q4k", "q4k"),
    Scheme("q4k+d8", "q4k", "int8"),
    Scheme("q5k", "q5k"),
    Scheme("q5k+d8", "q5k", "int8"),
    Scheme("int4+d4", "int4", "int4"),
    Scheme("int4+dq4k", "int4", "q4k"),
    Scheme("q4k+dq4k", "q4k", "q4k"),
    Scheme("q5k+dq5k", "q5k", "q5k"),
]
#: Every row by key: the base schemes, and each quantised one with --calib ("int4+calib").
SCHEMES: dict[str, Scheme] = {s.key: s for s in _BASE}
SCHEMES.update({s.with_calib().key: s.with_calib() for s in _BASE if s.key != "fp32"})
SCHEMES.update({s.key: s for s in _EXTRA})
SCHEMES.update({s.with_calib().key: s.with_calib() for s in _EXTRA})
DEFAULT_SCHEMES = [s.key for s in _BASE]


@dataclass
class Row:
    """The figures of one scheme on one board (error set when it could not be measured)."""

    scheme: Scheme
    board: str
    c_top1: float = float("nan")
    c_ppl: float = float("nan")
    c_ratio: float = float("nan")
    mirror_top1: float = float("nan")
    mirror_ppl: float = float("nan")
    mirror_ratio: float = float("nan")
    c_mirror_max_diff: float = float("nan")
    flash: int | None = None
    weight_bytes: int | None = None
    seconds: float = 0.0
    error: str | None = None
    #: The C logits of every window ([window, vocab] each), kept for callers (tests).
    c_logits: list[np.ndarray] | None = None


@dataclass
class Reference:
    """transformers' fp32 logits of the windows and their perplexity."""

    windows: np.ndarray  # [n, window] int64
    logits: list[np.ndarray]  # [window, vocab] float64 each
    ppl: float


# -- inputs --------------------------------------------------------------------------------------


def load_ids(
    checkpoint: Path,
    text: Path | None = None,
    ids: Path | None = None,
    tokenizer: Path | None = None,
) -> np.ndarray:
    """The held-out token stream: ids.npy as is, else text tokenized with tokenizer (default
    the checkpoint's tokenizer.json); with neither, the checkpoint's heldout.txt."""
    from colibri.frontends.tokenizer import load_tokenizer

    if ids is not None:
        return np.asarray(np.load(ids), dtype=np.int64).reshape(-1)
    if text is None:
        text = checkpoint / "heldout.txt"
        if not text.is_file():
            raise InputError(f"{checkpoint} has no heldout.txt: pass --text FILE or --ids FILE")
    tok = load_tokenizer(tokenizer or checkpoint / "tokenizer.json")
    return np.asarray(tok.encode(text.read_text(encoding="utf-8")), dtype=np.int64)


def load_hf(checkpoint: Path, threads: int = 2) -> Any:
    """transformers' causal LM of the checkpoint, fp32, eval mode (torch at `threads`)."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    return transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()


def hf_reference(hf: Any, windows: np.ndarray) -> Reference:
    """transformers' fp32 logits of every position of every window (one window at a time)."""
    import torch

    logits = []
    with torch.no_grad():
        for w in windows:
            out = hf(torch.from_numpy(np.asarray(w, np.int64)[None, :])).logits[0]
            logits.append(out.double().numpy())
    return Reference(np.asarray(windows), logits, perplexity(logits, windows))


# -- one scheme ----------------------------------------------------------------------------------


def scheme_options(scheme: Scheme, board: str, window: int, calib: Path | None) -> GenerateOptions:
    """What `colibri generate CKPT --max-context WINDOW [--quant ..] [--dense-quant ..]
    [--calib FILE]` is asked for the scheme."""
    if scheme.calib and calib is None:
        raise InputError(f"{scheme.flags}: pass --calib FILE (held-in token ids .npy, or text)")
    return GenerateOptions(
        board=board,
        name="acc",
        max_context=window,
        quant=scheme.quant,
        dense_quant=scheme.dense,
        calib=str(calib) if scheme.calib else None,
    )


class MirrorQuant:
    """The TransformerQuant `colibri generate` builds for each scheme, for the numpy mirror:
    the pipeline's own calibrate + quantise stages (colibri.cli.pipeline.quantise_transformer),
    so the mirror columns cannot drift from the C."""

    def __init__(self, model: MoETransformer) -> None:
        self.model = model

    def __call__(self, opts: GenerateOptions) -> TransformerQuant | None:
        return quantise_transformer(self.model, opts)[0]


def c_logits(gen: Path, board: str, windows: np.ndarray) -> list[np.ndarray]:
    """Build the generated transformer for `board` once, then run it teacher-forced on each
    window (no new token) and return the logits of every position ([window, vocab] float32)."""
    exe = build_model(gen, board)
    b = load_board(board)
    out = []
    with tempfile.TemporaryDirectory(prefix="colibri-acc-") as tmp:
        work = Path(tmp)
        for w in windows:
            write_lm_input(work / "input.bin", [int(t) for t in w], 0, SamplingOptions(), True)
            (work / "output.bin").unlink(missing_ok=True)
            run_elf(b, exe, work)
            res = read_lm_output(work / "output.bin", 0)
            assert res.logits is not None
            out.append(res.logits)
    return out


def measure_scheme(
    model: MoETransformer,
    scheme: Scheme,
    ref: Reference,
    board: str,
    work: Path,
    calib: Path | None = None,
    mirror: MirrorQuant | None = None,
) -> Row:
    """Generate, build and run one scheme on `board`; its figures against `ref` (and the numpy
    mirror's when `mirror` is given). A ColibriError (does not fit, no toolchain, bad calib)
    becomes the row's error."""
    row = Row(scheme, board)
    t0 = time.perf_counter()
    windows = ref.windows
    try:
        opts = scheme_options(scheme, board, int(windows.shape[1]), calib)
        gen, manifest = generate_c(model, work / scheme.key / board, opts, force=True)
        row.weight_bytes = int(manifest["memory"]["weight_bytes"])
        logits = c_logits(gen, board, windows)
        row.flash = size_report(gen, board).flash_used
        q = mirror(opts) if mirror is not None else None
    except ColibriError as exc:
        row.error = " ".join(str(exc).split())
        row.seconds = time.perf_counter() - t0
        return row
    row.c_logits = logits
    row.c_top1 = top1_agreement(logits, ref.logits)
    row.c_ppl = perplexity(logits, windows)
    row.c_ratio = perplexity_ratio(row.c_ppl, ref.ppl)
    if mirror is not None:
        mirrored = [forward(model, w, quant=q) for w in windows]
        row.mirror_top1 = top1_agreement(mirrored, ref.logits)
        row.mirror_ppl = perplexity(mirrored, windows)
        row.mirror_ratio = perplexity_ratio(row.mirror_ppl, ref.ppl)
        row.c_mirror_max_diff = max_abs_diff(logits, mirrored)
    row.seconds = time.perf_counter() - t0
    return row


def measure(
    checkpoint: Path,
    windows: np.ndarray,
    schemes: Sequence[str],
    board: str = "host",
    work: Path | None = None,
    calib: Path | None = None,
    mirror: bool = True,
    threads: int = 2,
) -> tuple[Reference, list[Row]]:
    """transformers' reference of the windows and one Row per scheme key (SCHEMES)."""
    ref = hf_reference(load_hf(checkpoint, threads), windows)
    model = load_hf_transformer(checkpoint)
    mq = MirrorQuant(model) if mirror else None
    rows = []
    with tempfile.TemporaryDirectory(prefix="colibri-acc-") as tmp:
        base = work or Path(tmp)
        for key in schemes:
            rows.append(measure_scheme(model, SCHEMES[key], ref, board, base, calib, mq))
    return ref, rows


# -- output --------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.2f} %"


def _num(x: float, fmt: str) -> str:
    return "-" if x != x else format(x, fmt)


def markdown_table(ref: Reference, rows: Sequence[Row]) -> str:
    """The rows as a markdown table (errors on their own rows)."""
    head = (
        "| scheme | board | C top-1 | C ppl | C ppl ratio | mirror top-1 | mirror ppl ratio "
        "| max abs C-mirror | flash | weights |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        cells = [r.scheme.flags, r.board]
        if r.error:
            cells += [f"n/a: {r.error[:160]}"] + [""] * 7
        else:
            cells += [
                _pct(r.c_top1),
                _num(r.c_ppl, ".3f"),
                _num(r.c_ratio, ".5f"),
                _pct(r.mirror_top1),
                _num(r.mirror_ratio, ".5f"),
                _num(r.c_mirror_max_diff, ".2e"),
                str(r.flash) if r.flash is not None else "-",
                str(r.weight_bytes) if r.weight_bytes is not None else "-",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    n, w = ref.windows.shape
    lines.append("")
    lines.append(
        f"transformers fp32: perplexity {ref.ppl:.3f} on {n} windows of {w} tokens "
        f"({n * (w - 1)} predicted tokens; top-1 over {n * w} positions)"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True, help="Hugging Face checkpoint dir")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--text", type=Path, help="held-out text (default CHECKPOINT/heldout.txt)")
    src.add_argument("--ids", type=Path, help="held-out token ids (.npy)")
    ap.add_argument("--tokenizer", type=Path, help="tokenizer.json (default the checkpoint's)")
    ap.add_argument("--windows", type=int, default=DEFAULT_WINDOWS)
    ap.add_argument("--window", type=int, default=DEFAULT_WINDOW)
    add_board_argument(ap, "host")
    ap.add_argument(
        "--schemes", nargs="+", choices=sorted(SCHEMES), help=f"default {DEFAULT_SCHEMES}"
    )
    ap.add_argument(
        "--calib", type=Path, help="held-in token ids (.npy) or text: adds --calib rows"
    )
    ap.add_argument("--no-mirror", action="store_true", help="skip the numpy mirror's columns")
    ap.add_argument("--work", type=Path, help="keep the generated directories here")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = ap.parse_args(argv)
    schemes = list(args.schemes or DEFAULT_SCHEMES)
    if args.calib is not None and args.schemes is None:
        schemes += [f"{k}+calib" for k in DEFAULT_SCHEMES if k != "fp32"]
    try:
        ids = load_ids(args.checkpoint, args.text, args.ids, args.tokenizer)
        windows = token_windows(ids, args.windows, args.window)
        ref, rows = measure(
            args.checkpoint,
            windows,
            schemes,
            args.board,
            args.work,
            args.calib,
            not args.no_mirror,
            args.threads,
        )
    except ColibriError as exc:
        print(f"accuracy_table: {exc}", file=sys.stderr)
        return 2
    print(markdown_table(ref, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
