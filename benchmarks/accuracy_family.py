"""Issue 38's accuracy table over a family of trained checkpoints, beside llama.cpp's k-quants.

For every member of FAMILY (trained by benchmarks/train_trained_moe.py into --cache on demand,
deterministically, unless it is the committed tests/data/trained_moe) and every scheme:

  colibri rows   `colibri generate --quant Q [--dense-quant int8] [--calib]` built for the host
                 and run teacher-forced on the held-out windows (accuracy_table.measure)
  llama.cpp rows the same checkpoint converted to GGUF by llama.cpp's convert_hf_to_gguf.py
                 (the checkpoint's own BPE tokenizer), quantised by llama-quantize to Q8_0,
                 Q4_K_M, Q5_K_M, Q6_K without and with an importance matrix (llama-imatrix on the
                 checkpoint's calibration windows, decoded to text), then dequantised back into a
                 transformers checkpoint with the gguf package (gguf_checkpoint) and run by
                 transformers fp32 on the same windows

Columns, all against transformers' fp32 model on the same windows (colibri.reference.lm_metrics):
top-1 agreement, perplexity ratio, KL divergence of the next-token distributions (nats, mean over
every position), bits per weight (every stored weight byte x 8 / parameters, the generated RoPE
tables left out; llama.cpp: the GGUF's tensor bytes) and the bits per weight of the routed
experts alone. llama.cpp's k-quants need rows
of a multiple of 256: on narrower matrices llama-quantize falls back to Q5_0 / Q5_1 / Q8_0 (the
"types" column lists the tensor types really written).

Output: --out DIR/accuracy_family.json (every row; rerunning skips the rows already there) and
accuracy_family.md: a table per member and the worst figure of each scheme over the family
(the README reports that one, not the best model), and issue 38's goals on it.

    python benchmarks/accuracy_family.py [--members NAME ...] [--cache ~/.cache/colibri/trained]
        [--llama-cpp DIR] [--llama-cpp-bin DIR] [--out DIR] [--no-llama] [--threads 2]

The gguf package is imported as installed, else from the llama.cpp tree's gguf-py.

Without llama.cpp (no --llama-cpp tree, or its build/bin lacks llama-quantize / llama-imatrix)
the llama.cpp rows are skipped with a message saying how to get it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (HERE, ROOT / "codegen"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import accuracy_table as acc  # noqa: E402
from colibri.reference.lm_metrics import (  # noqa: E402
    kl_divergence,
    perplexity,
    perplexity_ratio,
    token_windows,
    top1_agreement,
)


@dataclass(frozen=True)
class Member:
    """One trained checkpoint of the family: how train_trained_moe.py makes it."""

    name: str
    corpus: str
    size: str
    seed: int
    steps: int
    #: The committed checkpoint (not trained again), else None: trained into the cache.
    committed: str | None = None


FAMILY = [
    Member("pydoc-small-s0", "pydoc", "small", 0, 480, "tests/data/trained_moe"),
    Member("stdlib-small-s1", "stdlib", "small", 1, 360),
    Member("pydoc-k256-s2", "pydoc", "k256", 2, 400),
]
#: Training threads of the cached members (the figures depend on the thread count).
TRAIN_THREADS = 1
COLIBRI_SCHEMES = ["int8+d8", "int4", "q4k", "q5k", "q4k+d8", "q5k+d8"]
LLAMA_TYPES = ["Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K"]
#: The llama.cpp row each Colibri scheme is set against (issue 38's goals).
LLAMA_PEER = {"int8+d8": "Q8_0", "int4": "Q4_K_M", "q4k": "Q4_K_M", "q5k": "Q5_K_M"}
DEFAULT_CACHE = Path.home() / ".cache" / "colibri" / "trained"
#: --llama-cpp's default: the tree named by $COLIBRI_LLAMA_CPP, if set.
DEFAULT_LLAMA = (
    Path(os.environ["COLIBRI_LLAMA_CPP"]) if os.environ.get("COLIBRI_LLAMA_CPP") else None
)
GET_LLAMA = (
    "llama.cpp is needed for its rows: clone https://github.com/ggml-org/llama.cpp, build it "
    "with `cmake -B build && cmake --build build --target llama-quantize llama-imatrix`, and "
    "pass --llama-cpp DIR or set COLIBRI_LLAMA_CPP (its tree; --llama-cpp-bin for another "
    "binary directory), or "
    "--no-llama for the Colibri rows only"
)


# -- members -------------------------------------------------------------------------------------


def member_checkpoint(member: Member, cache: Path, log: Any = print) -> Path:
    """The member's checkpoint directory: the committed one, or cache/NAME, trained there by
    train_trained_moe.py (nice, TRAIN_THREADS threads) when it is missing."""
    if member.committed is not None:
        return ROOT / member.committed
    out = cache / member.name
    if (out / "model.safetensors").is_file() and (out / "train_log.json").is_file():
        return out
    log(f"training {member.name} into {out} ({member.steps} steps)")
    cmd = [sys.executable, str(HERE / "train_trained_moe.py"), "--out", str(out)]
    cmd += ["--size", member.size, "--corpus", member.corpus, "--seed", str(member.seed)]
    cmd += ["--steps", str(member.steps), "--threads", str(TRAIN_THREADS)]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    subprocess.run(["nice", *cmd], check=True, env=env)
    return out


def parameter_count(checkpoint: Path) -> tuple[int, int]:
    """(every parameter, the routed experts' ones) of a checkpoint's safetensors."""
    from safetensors import safe_open

    total = experts = 0
    with safe_open(str(checkpoint / "model.safetensors"), "np") as f:
        for key in f.keys():
            n = int(np.prod(f.get_slice(key).get_shape()))
            total += n
            experts += n if ".experts." in key else 0
    return total, experts


# -- GGUF back into transformers -------------------------------------------------------------------


def unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf's permutation of q / k rows (interleaved rotary pairs back to
    transformers' halves), per head of n_head."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's permutation of q / k rows (the inverse of unpermute_rope)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.weight$")
_PER_BLOCK = {
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate_inp": "block_sparse_moe.gate",
}
_EXPERTS = {"ffn_gate_exps": "w1", "ffn_down_exps": "w2", "ffn_up_exps": "w3"}
_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
}


def hf_tensors(name: str, w: np.ndarray, config: dict[str, Any]) -> dict[str, np.ndarray]:
    """The transformers (Mixtral, per-expert w1 / w2 / w3) tensors of one GGUF tensor `w`
    (numpy order, dequantised). KeyError for a tensor this mapping does not know."""
    if name in _GLOBAL:
        return {_GLOBAL[name]: w}
    m = _BLOCK.match(name)
    if m is None:
        raise KeyError(name)
    layer, kind = int(m.group(1)), m.group(2)
    pre = f"model.layers.{layer}."
    if kind == "attn_q":
        return {pre + "self_attn.q_proj.weight": unpermute_rope(w, config["num_attention_heads"])}
    if kind == "attn_k":
        return {pre + "self_attn.k_proj.weight": unpermute_rope(w, config["num_key_value_heads"])}
    if kind in _PER_BLOCK:
        return {pre + _PER_BLOCK[kind] + ".weight": w}
    if kind in _EXPERTS:
        moe = pre + "block_sparse_moe.experts."
        return {f"{moe}{e}.{_EXPERTS[kind]}.weight": w[e] for e in range(w.shape[0])}
    raise KeyError(name)


def gguf_module(src: Path | None) -> Any:
    """The gguf package: installed, else the gguf-py of the llama.cpp tree `src`."""
    try:
        import gguf  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        if src is None or not (src / "gguf-py").is_dir():
            raise
        sys.path.insert(0, str(src / "gguf-py"))
        import gguf  # type: ignore[import-not-found, unused-ignore]
    return gguf


def gguf_checkpoint(gguf_path: Path, reference: Path, out: Path, gguf: Any) -> dict[str, Any]:
    """Dequantise every tensor of a GGUF (gguf.quants.dequantize) into a transformers
    checkpoint at `out` (the reference checkpoint's config.json, its safetensors keys, fp32).
    Returns {"bytes": tensor bytes, "expert_bytes": the routed experts', "types": {type: n}}."""
    from safetensors.numpy import save_file

    config = json.loads((reference / "config.json").read_text())
    reader = gguf.GGUFReader(str(gguf_path), "r")
    tensors: dict[str, np.ndarray] = {}
    types: dict[str, int] = {}
    nbytes = expert_bytes = 0
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(list(t.shape)))
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(shape)
        tensors.update(hf_tensors(t.name, w, config))
        kind = t.tensor_type.name
        types[kind] = types.get(kind, 0) + 1
        nbytes += int(t.n_bytes)
        expert_bytes += int(t.n_bytes) if "_exps" in t.name else 0
    out.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    save_file(arrays, str(out / "model.safetensors"))
    shutil.copy(reference / "config.json", out / "config.json")
    return {"bytes": nbytes, "expert_bytes": expert_bytes, "types": types}


# -- rows ----------------------------------------------------------------------------------------


def figures(
    logits: list[np.ndarray], ref: acc.Reference, params: tuple[int, int], nbytes: int, ebytes: int
) -> dict[str, float]:
    """A row's figures against the reference."""
    ppl = perplexity(logits, ref.windows)
    return {
        "top1": top1_agreement(logits, ref.logits),
        "ppl": ppl,
        "ppl_ratio": perplexity_ratio(ppl, ref.ppl),
        "kl": kl_divergence(logits, ref.logits),
        "bpw": 8.0 * nbytes / params[0],
        "expert_bpw": 8.0 * ebytes / params[1] if ebytes else float("nan"),
    }


def colibri_rows(
    checkpoint: Path, ref: acc.Reference, params: tuple[int, int], keys: Iterable[str], work: Path
) -> dict[str, dict[str, Any]]:
    """One row per Colibri scheme key (accuracy_table.SCHEMES), built and run on the host."""
    from colibri.frontends.hf_model import load_hf_transformer

    model = load_hf_transformer(checkpoint)
    calib = checkpoint / "calib.npy"
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        scheme = acc.SCHEMES[key]
        row = acc.measure_scheme(model, scheme, ref, "host", work / "colibri", calib)
        entry: dict[str, Any] = {"kind": "colibri", "flags": scheme.flags, "seconds": row.seconds}
        if row.error or row.c_logits is None:
            entry["error"] = row.error or "no logits"
        else:
            nbytes, ebytes = colibri_bytes(work / "colibri" / key / "host")
            entry.update(figures(row.c_logits, ref, params, nbytes, ebytes))
        out[key] = entry
    return out


def colibri_bytes(gen: Path) -> tuple[int, int]:
    """(weight bytes without the RoPE tables, the routed experts' bytes) of a generated
    directory's manifest (memory.weight_parts)."""
    parts = json.loads((gen / "manifest.json").read_text())["memory"]["weight_parts"]
    total = sum(int(v) for k, v in parts.items() if k != "RoPE tables")
    return total, int(parts.get("routed experts", 0))


def calibration_text(checkpoint: Path, out: Path) -> Path:
    """The checkpoint's calibration windows (calib.npy) decoded to text for llama-imatrix, one
    window a line."""
    from colibri.frontends.tokenizer import load_tokenizer

    tok = load_tokenizer(checkpoint / "tokenizer.json")
    calib = np.load(checkpoint / "calib.npy")
    text = "\n".join(tok.decode([int(t) for t in w]) for w in calib)
    out.write_text(text, encoding="utf-8")
    return out


def llama_imatrix(bindir: Path, f32: Path, text: Path, out: Path, window: int) -> Path:
    """llama-imatrix's importance matrix of the F32 GGUF over the calibration text."""
    from host_table import _run_llama_step, llama_tool

    if not out.exists():
        exe = llama_tool(bindir, "llama-imatrix")
        tmp = out.with_name("part-" + out.name)
        cmd = [str(exe), "-m", str(f32), "-f", str(text), "-o", str(tmp), "-c", str(window)]
        _run_llama_step("llama-imatrix", [*cmd, "-t", "2", "--no-ppl"])
        tmp.replace(out)
    return out


def llama_rows(
    checkpoint: Path,
    ref: acc.Reference,
    params: tuple[int, int],
    src: Path,
    bindir: Path,
    work: Path,
    threads: int,
    done: dict[str, Any],
    save: Any,
) -> None:
    """llama.cpp's rows (LLAMA_TYPES, without and with the imatrix) into `done`, saved after
    each; the F32 GGUF round trip must give the checkpoint's weights back exactly."""
    from host_table import llama_gguf

    gguf = gguf_module(src)
    root = work / "llama"
    root.mkdir(parents=True, exist_ok=True)
    f32 = llama_gguf(src, bindir, checkpoint, root, "F32", vocab="gpt2")
    if "F32" not in done:
        check_roundtrip(f32, checkpoint, root / "F32", gguf)
        done["F32"] = {"kind": "llama", "roundtrip": "exact"}
    text = calibration_text(checkpoint, root / "calib.txt")
    imatrix = llama_imatrix(bindir, f32, text, root / "imatrix.gguf", int(ref.windows.shape[1]))
    for qtype in LLAMA_TYPES:
        for im in (None, imatrix):
            key = qtype + ("+imatrix" if im is not None else "")
            if key in done:
                continue
            t0 = time.perf_counter()
            path = llama_gguf(src, bindir, checkpoint, root, qtype, vocab="gpt2", imatrix=im)
            info = gguf_checkpoint(path, checkpoint, root / key, gguf)
            hf = acc.load_hf(root / key, threads)
            logits = acc.hf_reference(hf, ref.windows).logits
            entry: dict[str, Any] = {"kind": "llama", "flags": key, "types": info["types"]}
            entry.update(figures(logits, ref, params, info["bytes"], info["expert_bytes"]))
            entry["seconds"] = time.perf_counter() - t0
            done[key] = entry
            save()


def check_roundtrip(f32: Path, checkpoint: Path, out: Path, gguf: Any) -> None:
    """The F32 GGUF dequantised back must equal the checkpoint's weights (as fp32) exactly."""
    from safetensors import safe_open

    gguf_checkpoint(f32, checkpoint, out, gguf)
    with (
        safe_open(str(checkpoint / "model.safetensors"), "np") as a,
        safe_open(str(out / "model.safetensors"), "np") as b,
    ):
        if set(a.keys()) != set(b.keys()):
            raise SystemExit(f"GGUF round trip: tensors {sorted(set(a.keys()) ^ set(b.keys()))}")
        for k in a.keys():
            if not np.array_equal(a.get_tensor(k).astype(np.float32), b.get_tensor(k)):
                raise SystemExit(f"GGUF round trip: {k} differs")


# -- tables --------------------------------------------------------------------------------------


def _f(x: Any, fmt: str, scale: float = 1.0) -> str:
    if not isinstance(x, (int, float)) or x != x:
        return "-"
    return format(x * scale, fmt)


def _types(types: dict[str, int] | None) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted((types or {}).items()))


def _colibri_first(rows: dict[str, Any]) -> list[tuple[str, Any]]:
    """The rows, Colibri's before llama.cpp's, each kind in its measured order."""
    return sorted(rows.items(), key=lambda kv: kv[1]["kind"] != "colibri")


def member_table(result: dict[str, Any]) -> str:
    """One member's rows as markdown."""
    lines = [
        "| scheme | top-1 | ppl ratio | KL (nats) | bits/weight | expert bits/weight | types |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, r in _colibri_first(result["rows"]):
        if key == "F32":
            continue
        name = r.get("flags", key) if r["kind"] == "colibri" else f"llama.cpp {key}"
        if "error" in r:
            lines.append(f"| {name} | n/a: {r['error'][:120]} | | | | | |")
            continue
        cells = [
            name,
            _f(r["top1"], ".2f", 100) + " %",
            _f(r["ppl_ratio"], ".4f"),
            _f(r["kl"], ".5f"),
            _f(r["bpw"], ".2f"),
            _f(r["expert_bpw"], ".2f"),
            _types(r.get("types")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def worst_rows(results: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scheme key, the worst figure over the members: lowest top-1, highest perplexity
    ratio and KL (each with the member it comes from), bits per weight (whole model and routed
    experts) the highest."""
    worst: dict[str, dict[str, Any]] = {}
    for res in results:
        for key, r in res["rows"].items():
            if "top1" not in r:
                continue
            w = worst.setdefault(key, {"kind": r["kind"], "flags": r.get("flags", key)})
            picks = (("top1", min), ("ppl_ratio", max), ("kl", max), ("bpw", max))
            for col, pick in (*picks, ("expert_bpw", max)):
                if col not in w or pick(w[col], r[col]) != w[col]:
                    w[col] = r[col]
                    w[col + "_member"] = res["member"]
    return worst


def worst_table(results: Sequence[dict[str, Any]]) -> str:
    """The worst member's figure per scheme, as markdown."""
    lines = [
        "| scheme | worst top-1 | worst ppl ratio | worst KL (nats) | bits/weight "
        "| expert bits/weight |",
        "|---|---|---|---|---|---|",
    ]
    for key, w in _colibri_first(worst_rows(results)):
        name = w["flags"] if w["kind"] == "colibri" else f"llama.cpp {key}"
        cells = [
            name,
            f"{_f(w['top1'], '.2f', 100)} % ({w['top1_member']})",
            f"{_f(w['ppl_ratio'], '.4f')} ({w['ppl_ratio_member']})",
            f"{_f(w['kl'], '.5f')} ({w['kl_member']})",
            _f(w["bpw"], ".2f"),
            _f(w["expert_bpw"], ".2f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals(results: Sequence[dict[str, Any]]) -> list[str]:
    """Issue 38's accuracy goals, met or missed, on every member (lines of text): int8 + d8
    against Q8_0; q4k and q4k + d8 (those measured), with --calib against Q4_K_M with the
    imatrix and without against Q4_K_M without."""
    out = []
    for res in results:
        m = res["member"]

        def get(key: str, col: str, rows: dict[str, Any] = res["rows"]) -> float:
            v = rows.get(key, {}).get(col)
            return float(v) if isinstance(v, (int, float)) else math.nan

        def verdict(ok: bool, nan: bool) -> str:
            return "n/a" if nan else ("met" if ok else "MISSED")

        t, q8, ratio = get("int8+d8", "top1"), get("Q8_0", "top1"), get("int8+d8", "ppl_ratio")
        nan = math.isnan(t) or math.isnan(q8) or math.isnan(ratio)
        out.append(
            f"{m}: int8+d8 top-1 {100 * t:.2f} % vs Q8_0 {100 * q8:.2f} % (>= it and >= 99.2 %), "
            f"ppl ratio {ratio:.4f} (<= 1.002): "
            + verdict(t >= q8 and t >= 0.992 and ratio <= 1.002, nan)
        )
        pairs = [(q + "+calib", "Q4_K_M+imatrix") for q in ("q4k", "q4k+d8")]
        pairs += [(q, "Q4_K_M") for q in ("q4k", "q4k+d8")]
        for ours, peer in pairs:
            if ours not in res["rows"]:
                continue
            t, pt = get(ours, "top1"), get(peer, "top1")
            k, pk = get(ours, "kl"), get(peer, "kl")
            bpw = get(ours, "expert_bpw")
            nan = any(math.isnan(x) for x in (t, pt, k, pk))
            out.append(
                f"{m}: {ours} top-1 {100 * t:.2f} % / KL {k:.5f} vs {peer} {100 * pt:.2f} % / "
                f"{pk:.5f} (expert bits/weight {bpw:.2f} <= 4.6): "
                + verdict(t >= pt and k <= pk and not bpw > 4.6, nan)
            )
    return out


def report(results: Sequence[dict[str, Any]]) -> str:
    """The markdown report: a table per member, the worst-member table, the goals."""
    parts = []
    for res in results:
        info = res["info"]
        parts.append(
            f"### {res['member']}: {info['corpus']} corpus, {info['size']} "
            f"({info['parameters']} parameters), seed {info['seed']}, {info['steps']} steps; "
            f"transformers fp32 perplexity {res['reference_ppl']:.3f} on "
            f"{res['windows'][0]} x {res['windows'][1]} held-out tokens\n"
        )
        parts.append(member_table(res) + "\n")
    parts.append("### Worst member per scheme\n")
    parts.append(worst_table(results) + "\n")
    parts.append("### Issue 38's goals per member\n")
    parts.append("\n".join(f"- {g}" for g in goals(results)) + "\n")
    return "\n".join(parts)


# -- main ----------------------------------------------------------------------------------------


def llama_bindir(src: Path | None, bindir: Path | None) -> Path | None:
    """The directory of llama-quantize and llama-imatrix, or None (with the message) if absent."""
    if src is None or not (src / "convert_hf_to_gguf.py").is_file():
        print(f"accuracy_family: no llama.cpp tree ({src}): {GET_LLAMA}", file=sys.stderr)
        return None
    b = bindir or src / "build" / "bin"
    missing = [n for n in ("llama-quantize", "llama-imatrix") if not (b / n).is_file()]
    if missing:
        print(f"accuracy_family: {b} lacks {', '.join(missing)}: {GET_LLAMA}", file=sys.stderr)
        return None
    return b


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--members", nargs="+", choices=[m.name for m in FAMILY])
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="trained members' home")
    ap.add_argument(
        "--llama-cpp", type=Path, default=DEFAULT_LLAMA, help="llama.cpp tree ($COLIBRI_LLAMA_CPP)"
    )
    ap.add_argument("--llama-cpp-bin", type=Path, help="its binaries (default TREE/build/bin)")
    ap.add_argument("--no-llama", action="store_true", help="the Colibri rows only")
    ap.add_argument("--schemes", nargs="+", default=COLIBRI_SCHEMES, choices=sorted(acc.SCHEMES))
    ap.add_argument("--no-calib", action="store_true", help="skip the --calib rows")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "accuracy_family")
    ap.add_argument("--windows", type=int, default=acc.DEFAULT_WINDOWS)
    ap.add_argument("--window", type=int, default=acc.DEFAULT_WINDOW)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    members = [m for m in FAMILY if args.members is None or m.name in args.members]
    keys = list(args.schemes)
    if not args.no_calib:
        keys += [k + "+calib" for k in args.schemes if k != "fp32"]
    bindir = None if args.no_llama else llama_bindir(args.llama_cpp, args.llama_cpp_bin)
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / "accuracy_family.json"
    saved: dict[str, Any] = json.loads(json_path.read_text()) if json_path.is_file() else {}

    def save() -> None:
        json_path.write_text(json.dumps(saved, indent=1, default=_jsonable) + "\n")

    results = []
    for member in members:
        ckpt = member_checkpoint(member, args.cache)
        params = parameter_count(ckpt)
        ids = acc.load_ids(ckpt)
        windows = token_windows(ids, args.windows, args.window)
        ref = acc.hf_reference(acc.load_hf(ckpt, args.threads), windows)
        res = saved.setdefault(member.name, {"member": member.name, "rows": {}})
        res.update(
            info=dict(asdict(member), parameters=params[0], expert_parameters=params[1]),
            reference_ppl=ref.ppl,
            windows=list(windows.shape),
        )
        todo = [k for k in keys if k not in res["rows"]]
        work = args.out / member.name
        for key in todo:
            print(f"{member.name}: colibri {key}", flush=True)
            res["rows"].update(colibri_rows(ckpt, ref, params, [key], work))
            save()
        if bindir is not None:
            print(f"{member.name}: llama.cpp rows", flush=True)
            src = args.llama_cpp
            llama_rows(ckpt, ref, params, src, bindir, work, args.threads, res["rows"], save)
        save()
        results.append(res)
    text = report(results)
    (args.out / "accuracy_family.md").write_text(text)
    print(text)
    print(f"wrote {json_path} and {args.out / 'accuracy_family.md'}")
    return 0


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(type(x))


if __name__ == "__main__":
    raise SystemExit(main())
