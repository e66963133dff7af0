#!/usr/bin/env python3
"""Instructions per multiply-accumulate of the generated expert kernels and of the whole forward
pass, per board and scheme, plus the router's instructions per token (issue 11).

    python benchmarks/kernels_table.py [--board host] [--board cortex-m4] [--scheme int8]
                                       [--json kernels.json] [--tiny] [--workdir DIR]
                                       [--family N [--seed S]]
                                       [--sweep N [--seed S] [--cmsis-nn DIR]]

The model is the issue's: the seed toy (colibri.frontends.seed.make_toy, 2 experts) with
d_model 128, d_ff 512, relu, top-k 1, generated with ``--quant SCHEME`` (fp32: no --quant) and
default flags (but --max-tokens 9) for each board, built by the usual model build and run by
the usual runner on 1, 8 and 9 tokens. A token costs 2 * d_model * d_ff MACs (w1 and w2 of
its one expert).

Columns (instructions / MAC; counts are deterministic: callgrind on the host, QEMU's TCG plugin
tools/qemu_icount/icount.c on every other board):

  kernel@1, kernel@8  the generated expert kernels alone: instructions executed inside the calls
                      of ``<name>_expert_<i>`` (the functions the runtime calls through
                      colibri_model_t.kernels; everything they call included, so whatever the
                      expert's FFN kernel inlines or calls is counted, and nothing else: no
                      router, gather/scatter or memcpy of the runtime) in a 1- / 8-token forward
                      pass, divided by the pass's MACs. These functions are always real calls:
                      the runtime calls them through a function pointer (their address is in
                      the generated dispatch table), on every board, whatever is inlined in them.
  kslope              (kernel@9 tokens - kernel@1 token) / 8 / MACs per token: the kernels'
                      marginal cost of one more token (the slope of the kernels alone).
  pass@1, pass@8      the whole forward pass (colibri_forward between the runner's bench
                      markers) of 1 / 8 tokens divided by its MACs: fixed per-call cost included.
  slope               (pass of 9 tokens - pass of 1 token) / 8 / MACs per token: the issue's
                      whole-pass figure, the marginal cost of one more token.
  group8              one expert kernel called once with a group of 8 tokens (8 tokens that the
                      router sends all to expert 0, picked with the numpy router), per MAC:
                      what the kernel costs when it reads its weights once for 8 tokens.
  g8/k1               group8 / kernel@1: the issue's "8 tokens <= 0.7x one token" ratio.

Router: benchmarks/router_table.py's bench (64 experts, k 2; 1024 tokens hosted, 256 bare
metal, a quarter of that until it fits a small board's RAM): instructions per token of qsort +
take-k + softmax, the plain two-pass loop and colibri_route_gate.

The model is generated with max_tokens 9 (one chunk holds the longest pass, and small boards'
RAM holds the chunk); everything else is the default.

A board whose toolchain or emulator is missing (e.g. esp32s3 without xtensa-esp32s3-elf-gcc),
or a scheme whose weights do not fit a board, is reported as skipped with the reason.
``--tiny`` (for tests): d_model 32, d_ff 64, router on 16 tokens, one round.

``--family N --seed S``: instead of the one shape, N shapes drawn by a seeded generator (the same
N and S give the same shapes): d_model in 16..192 and d_ff in 16..512, odd sizes and sizes that are
no multiple of 32 included (the first shape is always odd by odd), the activation cycling through
relu, silu and gelu and top-k through 1 and 2 (2 experts, so k 2 runs both). Each shape is
measured as above (no router); a token costs 2 * k * d_model * d_ff MACs. The table lists every
shape, then per board and scheme the minimum, median and maximum of each column over the family
and the shape of the worst (largest) whole-pass slope.

``--sweep N --seed S [--cmsis-nn DIR]`` (issue 40): N shapes drawn by a seeded generator, d_model
and d_ff log-uniform in 16..1024 (the first odd by odd, the second multiples of 16 but not of 32),
the activation cycling through relu, silu, gelu, gelu_tanh and swiglu, top-k through 1 and 2,
4..16 experts (halved, down to max(2, k), on a board whose flash the model does not fit; on a
board whose RAM it does not fit, the chunk of tokens halved first: 9, 4, 2, 1, label ``tN``,
the longer passes then run in chunks with the same results), on every MCU board
(cortex-m3/m4/m7/m55, esp32s3; --board picks some) and every scheme. Per case: pass@1, slope and
kslope as above, and from the build's stack report (colibri.targets.stack) the code reachable
from one expert kernel (every function it reaches, itself included: one expert kind's flash) and
its worst-case stack. With ``--cmsis-nn DIR`` (a CMSIS-NN checkout; CI runs without one), every
int8 / int4 case on an Arm board also builds benchmarks/cmsis_fc_bench.c against it: CMSIS-NN's
``arm_fully_connected_s8`` / ``_s4`` pair (w1 with a ReLU clamp, then w2) on the same d_model and
d_ff, counted the same way (the 1-vs-9-token slope per MAC), and the code reachable from the pair.
The table lists every case, then per board and scheme the min / median / max of each column and
the worst case; ``--json`` writes the report and a PNG beside it (whole-pass slope against MACs
per token, CMSIS-NN's beside).

Every run of a sweep case (1, 8, 9 tokens and the group of 8) is checked against the numpy
mirror (colibri.reference.kernels.quant_moe_forward with the generator's quantisation): the
expert ids equal, the outputs bit for bit where the experts' activations are int8 (int8, int4,
q4k, q5k), else (fp32 activations: fp32, fp16) within the
scheme's LAYER_TOLERANCE; and every weight part on a board whose kernels have a fast layout for
the scheme (r4 / r4p, q4r4 / q4h4, c8) must be stored in it, not in the generic ``rows`` (the
manifest's ``weight_layouts``). A case that fails to generate, build or run, differs from the
mirror or falls back to ``rows`` is a problem: the table ends with them and the exit status is
1 (a case skipped because the model does not fit the board is not one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "codegen"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import plots  # noqa: E402
import router_table  # noqa: E402
from bench_common import build_bench, count_modes  # noqa: E402
from colibri.boards import Board, load_board  # noqa: E402
from colibri.cli.argtypes import add_board_argument, board_help  # noqa: E402
from colibri.cli.pipeline import generate  # noqa: E402
from colibri.errors import BudgetExceeded, ColibriError  # noqa: E402
from colibri.frontends.seed import make_toy  # noqa: E402
from colibri.ir.moe import MoELayer  # noqa: E402
from colibri.options import GenerateOptions  # noqa: E402
from colibri.quant.formats import LAYER_TOLERANCE, make_plan, quantize_layer  # noqa: E402
from colibri.quant.layouts import (  # noqa: E402
    C8_ISAS,
    F16C8_ISAS,
    Q4H4_ISAS,
    Q4R4_ISAS,
    R4_ISAS,
)
from colibri.reference.kernels import quant_moe_forward  # noqa: E402
from colibri.reference.moe import compare, route  # noqa: E402
from colibri.targets.build import build_model  # noqa: E402
from colibri.targets.lmrun import read_output, write_input  # noqa: E402
from colibri.targets.qemu import run_elf  # noqa: E402
from colibri.targets.stack import analyse_stack, load_report  # noqa: E402

BOARDS = (
    "host",
    "cortex-m3",
    "cortex-m4",
    "cortex-m7",
    "cortex-m55",
    "cortex-a7",
    "cortex-a53",
    "cortex-a76",
    "esp32s3",
)
SCHEMES = ("int8", "int4", "fp16", "fp32", "q4k", "q5k")
FAMILY_ACTIVATIONS = ("relu", "silu", "gelu")
#: --sweep: every MCU board, every activation.
SWEEP_BOARDS = ("cortex-m3", "cortex-m4", "cortex-m7", "cortex-m55", "esp32s3")
SWEEP_ACTIVATIONS = ("relu", "silu", "gelu", "gelu_tanh", "swiglu")
#: CMSIS-NN's fully-connected function for a Colibri scheme (--cmsis-nn), and its sources.
CMSIS_FC = {"int8": "s8", "int4": "s4"}
CMSIS_SOURCES = (
    "Source/FullyConnectedFunctions/arm_fully_connected_s8.c",
    "Source/FullyConnectedFunctions/arm_fully_connected_s4.c",
    "Source/FullyConnectedFunctions/arm_vector_sum_s8.c",
    "Source/NNSupportFunctions/arm_nn_vec_mat_mult_t_s8.c",
    "Source/NNSupportFunctions/arm_nn_vec_mat_mult_t_s4.c",
)
TOKENS = (1, 8, 9)
NAME = "kt"  # the generated model's name: its expert kernels are kt_expert_<i>
COLUMNS = ("kernel@1", "kernel@8", "kslope", "pass@1", "pass@8", "slope", "group8", "g8/k1")


def model_shape(
    tiny: bool,
    d_model: int = 128,
    d_ff: int = 512,
    activation: str = "relu",
    top_k: int = 1,
    experts: int = 2,
) -> dict[str, Any]:
    if tiny:
        d_model, d_ff = 32, 64
    matrices = 3 if activation == "swiglu" else 2  # w1 (+ w3 gated) and w2
    return {
        "source": "colibri.frontends.seed.make_toy (seed layout)",
        "experts": experts,
        "d_model": d_model,
        "d_ff": d_ff,
        "activation": activation,
        "top_k": top_k,
        "seed": 3,
        "macs_per_token": matrices * top_k * d_model * d_ff,
    }


def sweep_shapes(n: int, seed: int) -> list[dict[str, Any]]:
    """n model shapes drawn from `seed` (see the module docstring, --sweep): d_model and d_ff
    log-uniform in 16..1024, the first odd by odd, the second multiples of 16 but not of 32,
    the activation cycling through SWEEP_ACTIVATIONS, top-k through 1 and 2, 4..16 experts."""
    rng = np.random.default_rng(seed)
    shapes = []
    for i in range(n):
        d_model, d_ff = (
            int(round(float(np.exp(rng.uniform(np.log(16), np.log(1024)))))) for _ in "df"
        )
        if i == 0:
            d_model, d_ff = d_model | 1, d_ff | 1
        elif i == 1:
            d_model, d_ff = (v // 32 * 32 + 16 for v in (d_model, d_ff))
        act = SWEEP_ACTIVATIONS[i % len(SWEEP_ACTIVATIONS)]
        experts = int(rng.integers(4, 17))
        shapes.append(model_shape(False, d_model, d_ff, act, 1 + i % 2, experts))
    return shapes


def family_shapes(n: int, seed: int) -> list[dict[str, Any]]:
    """n model shapes drawn from `seed` (see the module docstring, --family)."""
    rng = np.random.default_rng(seed)
    shapes = []
    for i in range(n):
        d_model = int(rng.integers(16, 193))
        d_ff = int(rng.integers(16, 513))
        if i == 0:  # one shape odd by odd: every kernel's tails at once
            d_model, d_ff = d_model | 1, d_ff | 1
        act = FAMILY_ACTIVATIONS[i % len(FAMILY_ACTIVATIONS)]
        shapes.append(model_shape(False, d_model, d_ff, act, 1 + i % 2))
    return shapes


def shape_label(shape: dict[str, Any]) -> str:
    """d_model x d_ff, activation, k: one table cell."""
    return f"{shape['d_model']}x{shape['d_ff']} {shape['activation']} k{shape['top_k']}"


def family_summary(results: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """min / median / max of every column over a board and scheme's measured shapes, and the
    shape whose whole-pass slope is the largest (results: (shape, measure_scheme's result))."""
    done = [(shape, res) for shape, res in results if "skipped" not in res]
    if not done:
        return {"skipped": "no shape of the family was measured"}
    stats = {}
    for c in COLUMNS:
        v = np.array([res["instr_per_mac"][c] for _, res in done])
        stats[c] = {"min": float(v.min()), "median": float(np.median(v)), "max": float(v.max())}
    worst_shape, worst = max(done, key=lambda sr: sr[1]["instr_per_mac"]["slope"])
    return {
        "shapes": len(done),
        "skipped": len(results) - len(done),
        "stats": stats,
        "worst": {"shape": shape_label(worst_shape), "instr_per_mac": worst["instr_per_mac"]},
    }


def group_tokens(layer: MoELayer, n: int) -> np.ndarray:
    """n tokens (float32 rows) that the layer's router sends all to expert 0: the runtime's
    routing as the numpy mirror computes it (colibri.reference.moe.route, bit-exact logits),
    with a clear margin over the other experts' logits."""
    rng = np.random.default_rng(1234)
    picked: list[np.ndarray] = []
    while len(picked) < n:
        x = rng.standard_normal((64, layer.config.d_model)).astype(np.float32)
        r = route(layer, x)
        top2 = np.sort(r.logits.astype(np.float64), axis=1)[:, -2:]
        keep = (r.expert_ids[:, 0] == 0) & (top2[:, 1] - top2[:, 0] > 0.5)
        picked += list(x[keep])
    return np.stack(picked[:n])


def measure_scheme(board: Board, scheme: str, shape: dict[str, Any], work: Path) -> dict[str, Any]:
    """Instruction counts and instr/MAC of one board and scheme, or {"skipped": why}."""
    layer = make_toy(
        experts=shape["experts"],
        hidden=shape["d_model"],
        ff=shape["d_ff"],
        top_k=shape["top_k"],
        activation=shape["activation"],
        seed=shape["seed"],
    )
    gen = work / scheme
    # one chunk holds the longest pass (no chunking), and no more: small boards' RAM
    chunk = shape.get("max_tokens", max(TOKENS))
    opts: dict[str, Any] = {"board": board.name, "name": NAME, "max_tokens": chunk}
    if scheme != "fp32":
        opts["quant"] = scheme
    try:
        _, manifest = generate(layer, gen, GenerateOptions(**opts), force=True)
        exe = build_model(gen, board.name)
    except BudgetExceeded as exc:
        return {"skipped": " ".join(line.strip() for line in str(exc).splitlines()[:2])}
    kernel = kernel_footprint(exe)
    plan = make_plan(shape["experts"], scheme)
    qexperts = quantize_layer(layer, plan)
    mirror: list[dict[str, Any]] = []
    passes: dict[str, int] = {}
    kernels: dict[str, int] = {}
    d = shape["d_model"]
    runs: list[tuple[str, np.ndarray]] = [
        (str(n), np.random.default_rng(n).standard_normal((n, d)).astype(np.float32))
        for n in TOKENS
    ]
    runs.append(("group8", group_tokens(layer, 8)))
    with tempfile.TemporaryDirectory(prefix="colibri-kernels-") as tmp:
        cwd = Path(tmp)
        for key, x in runs:
            n = len(x)
            write_input(cwd / "input.bin", x)
            result = run_elf(
                board, exe, cwd, count_instructions=True, count_prefix=f"{NAME}_expert_"
            )
            if result.instructions is None or result.prefix_instructions is None:
                raise SystemExit(
                    f"{board.name} {scheme}: no count for {n} tokens "
                    f"(pass {result.instructions}, kernel {result.prefix_instructions})"
                )
            mirror.append({"run": key, **mirror_check(layer, qexperts, plan, x, cwd)})
            passes[key] = result.instructions
            kernels[key] = result.prefix_instructions
    macs = shape["macs_per_token"]
    per_mac = {
        "kernel@1": kernels["1"] / macs,
        "kernel@8": kernels["8"] / (8 * macs),
        "kslope": (kernels["9"] - kernels["1"]) / 8 / macs,
        "pass@1": passes["1"] / macs,
        "pass@8": passes["8"] / (8 * macs),
        "slope": (passes["9"] - passes["1"]) / 8 / macs,
        "group8": kernels["group8"] / (8 * macs),
    }
    per_mac["g8/k1"] = per_mac["group8"] / per_mac["kernel@1"]
    out: dict[str, Any] = {
        "instructions": {"pass": passes, "kernel": kernels},
        "instr_per_mac": per_mac,
        "experts": shape["experts"],
        "max_tokens": chunk,
        "mirror": mirror,
        "layouts": manifest.get("weight_layouts", {}),
        "generic": generic_fallbacks(board, scheme, manifest),
    }
    if kernel is not None:
        out["kernel"] = kernel
    return out


def mirror_check(
    layer: MoELayer, qexperts: dict[int, Any], plan: Any, x: np.ndarray, cwd: Path
) -> dict[str, Any]:
    """The run's output (cwd/output.bin) against the numpy mirror
    (colibri.reference.kernels.quant_moe_forward with the generator's quantisation): the expert
    ids equal, and the outputs bit for bit where the experts' activations are int8 (every
    integer scheme), else within the scheme's LAYER_TOLERANCE. {"ok": bool, "how": "bit-exact" or
    the tolerance, "error": what differs (when not ok)}."""
    got = read_output(cwd / "output.bin")
    ref, rq = quant_moe_forward(layer, qexperts, x)
    want = ref.astype(np.float32)
    exact = plan.acts[0] == "int8"
    how = "bit-exact" if exact else f"tol {LAYER_TOLERANCE[(plan.schemes[0], plan.acts[0])]}"
    err: str | None = None
    if got.output.shape != want.shape:
        err = f"output shape {got.output.shape} != {want.shape}"
    elif not np.array_equal(got.expert_ids, rq.expert_ids):
        err = f"expert ids differ in {int((got.expert_ids != rq.expert_ids).sum())} slots"
    elif exact:
        differ = got.output.view(np.uint32) != want.view(np.uint32)
        if differ.any():
            err = (
                f"{int(differ.sum())} of {want.size} outputs differ, first at "
                f"{np.argwhere(differ)[0].tolist()}, max |diff| "
                f"{float(np.abs(got.output - want).max()):.3g}"
            )
    else:
        err = compare(got.output, ref, LAYER_TOLERANCE[(plan.schemes[0], plan.acts[0])])
    return {"ok": err is None, "how": how, **({"error": err} if err else {})}


#: The fast layouts a board's expert kernels read, per scheme and the ISAs that have them
#: (colibri.quant.layouts): a matrix of such a board stored in the generic "rows" is a fallback.
FAST_LAYOUT_ISAS = {
    "int8": R4_ISAS,
    "int4": Q4R4_ISAS + Q4H4_ISAS,
    "fp16": F16C8_ISAS,
    "fp32": C8_ISAS,
}


def generic_fallbacks(board: Board, scheme: str, manifest: dict[str, Any]) -> list[str]:
    """The weight parts (``kind.part``) that the manifest records in the generic layout "rows"
    on a board whose kernels have a fast layout for the scheme (FAST_LAYOUT_ISAS)."""
    if board.isa not in FAST_LAYOUT_ISAS.get(scheme, ()):
        return []
    return [
        f"{kind}.{part}"
        for kind, lay in sorted(manifest.get("weight_layouts", {}).items())
        for part, name in sorted(lay.items())
        if name == "rows"
    ]


def kernel_footprint(elf: Path) -> dict[str, Any] | None:
    """Expert 0's kernel in a bare-metal build's stack report (colibri.targets.stack): the code
    it reaches, its worst-case stack and largest frame, and the guard below the stack. None on
    hosted boards (no report)."""
    rep = load_report(elf)
    if rep is None:
        return None
    k0 = next((k for k in rep.kernels if k["name"] == f"{NAME}_expert_0"), None)
    if k0 is None:
        return None
    return {"code": k0["code"], "stack": k0["bound"], "frame": k0["frame"], "guard": rep.guard}


def measure_fitting(board: Board, scheme: str, shape: dict[str, Any], work: Path) -> dict[str, Any]:
    """measure_scheme while the model does not fit the board: with half the tokens per chunk
    (9, 4, 2, 1: the longer passes run in chunks, with the same results) while its RAM is short,
    with half the experts (down to max(2, top_k)) while its flash is; the result's "experts"
    and "max_tokens" say what was measured."""
    res = measure_scheme(board, scheme, shape, work)
    while "skipped" in res:
        chunk = shape.get("max_tokens", max(TOKENS))
        if "RAM: needs" in res["skipped"] and chunk > 1:
            shape = {**shape, "max_tokens": chunk // 2}
        elif shape["experts"] > max(2, shape["top_k"]):
            shape = {**shape, "experts": max(2, shape["top_k"], shape["experts"] // 2)}
        else:
            break
        res = measure_scheme(board, scheme, shape, work)
    return res


def measure_cmsis(
    board: Board, scheme: str, shape: dict[str, Any], cmsis: Path, work: Path
) -> dict[str, Any]:
    """CMSIS-NN's fully-connected pair (benchmarks/cmsis_fc_bench.c) on the shape: the same
    1-vs-9-token slope per MAC, the code reachable from the pair and its stack, or
    {"skipped": why}."""
    fc = CMSIS_FC.get(scheme)
    if fc is None or not (board.is_baremetal and board.arch.startswith("armv")):
        return {
            "skipped": f"CMSIS-NN (Cortex-M) has no {scheme} fully-connected layer on {board.name}"
        }
    d, f = shape["d_model"], shape["d_ff"]
    defines = [f"FC_D={d}", f"FC_F={f}", f"FC_S4={1 if fc == 's4' else 0}"]
    elf = build_bench(
        board,
        [ROOT / "benchmarks" / "cmsis_fc_bench.c"],
        defines,
        work,
        "cmsis_fc",
        foreign=[cmsis / src for src in CMSIS_SOURCES],
        includes=[cmsis / "Include"],
    )
    (n1, line1), (n9, line9) = count_modes(board, elf, (1, 9), "cmsis-fc:")
    if "status ok" not in line1 or "status ok" not in line9:
        raise SystemExit(f"{board.name}: CMSIS-NN {fc} failed: {line1.strip()} / {line9.strip()}")
    macs = 2 * d * f
    rep = analyse_stack(elf, board, [], kernel_roots=("cmsis_fc_pair",))
    pair = next(k for k in rep.kernels if k["name"] == "cmsis_fc_pair")
    return {
        "function": f"arm_fully_connected_{fc}",
        "instructions": {"1": n1, "9": n9},
        "instr_per_mac": {"pass@1": n1 / macs, "slope": (n9 - n1) / 8 / macs},
        "code": pair["code"],
        "stack": pair["bound"],
    }


def measure_router(board: Board, tiny: bool, work: Path) -> dict[str, Any]:
    """router_table.py's three ways on `board`: instructions per token."""
    tokens = 16 if tiny else (256 if board.is_baremetal else 1024)
    rounds = 1 if tiny else 2
    with contextlib.redirect_stdout(sys.stderr):  # its progress line: keep stdout the table
        while True:
            try:
                elf = router_table.build(board, tokens, work / str(tokens))
                break
            except SystemExit as exc:  # e.g. the logits overflow a small board's RAM
                if tokens <= 16:
                    return {"skipped": f"router bench does not build: {str(exc)[-300:]}"}
                print(f"{board.name}: router bench with {tokens} tokens failed", file=sys.stderr)
                tokens //= 4
        counts = router_table.count(board, elf, tokens, rounds)
    qsort_n, plain_n, route_n = counts
    return {
        "tokens": tokens,
        "experts": 64,
        "top_k": 2,
        "per_token": {
            "qsort": qsort_n / tokens,
            "plain": plain_n / tokens,
            "route_gate": route_n / tokens,
        },
        "route_gate_vs_qsort": qsort_n / route_n,
        "route_gate_vs_plain": plain_n / route_n,
    }


def short_reason(why: str) -> str:
    """A skip reason in one table cell: the budget overrun, or the first sentence."""
    over = re.search(r"(\w+): needs [^\n]*?: (\d+) bytes over budget", why)
    if over is not None:
        return f"skipped: does not fit ({over.group(1)} {over.group(2)} bytes over budget)"
    return "skipped: " + why.split(". ")[0]


def render(report: dict[str, Any]) -> str:
    shape = report["model"]
    lines = [
        f"Expert kernels and forward pass, instructions / MAC: toy seed layout, "
        f"{shape['experts']} experts, d_model {shape['d_model']}, d_ff {shape['d_ff']}, "
        f"{shape['activation']}, k {shape['top_k']} ({shape['macs_per_token']} MACs per token)",
        "  kernel@N: inside the generated expert kernels (<name>_expert_<i>, callees included) "
        "in an N-token pass / MACs",
        "  kslope:   (kernels in a 9-token pass - in a 1-token pass) / 8 / MACs per token",
        "  pass@N:   whole N-token forward pass / MACs (fixed cost included)",
        "  slope:    (pass of 9 tokens - pass of 1) / 8 / MACs per token",
        "  group8:   one expert kernel called with 8 tokens (all routed to expert 0) / MACs; "
        "g8/k1 = group8 / kernel@1",
        "",
        f"{'board':11} {'counted by':11} {'scheme':6} " + " ".join(f"{c:>9}" for c in COLUMNS),
    ]
    for name, entry in report["boards"].items():
        if "skipped" in entry:
            lines.append(f"{name:11} {short_reason(entry['skipped'])}")
            continue
        for scheme, res in entry["schemes"].items():
            head = f"{name:11} {entry['counted_by']:11} {scheme:6} "
            if "skipped" in res:
                lines.append(head + short_reason(res["skipped"]))
                continue
            lines.append(head + " ".join(f"{res['instr_per_mac'][c]:>9.2f}" for c in COLUMNS))
    routers = [
        (n, e["router"])
        for n, e in report["boards"].items()
        if "router" in e and "skipped" not in e["router"]
    ]
    if routers:
        r0 = routers[0][1]
        lines += [
            "",
            f"Router, instructions per token ({r0['experts']} experts, k {r0['top_k']}; "
            "benchmarks/router_table.py)",
            f"{'board':11} {'tokens':>6} {'qsort':>9} {'plain':>9} {'route_gate':>10} "
            f"{'vs qsort':>9} {'vs plain':>9}",
        ]
        for name, r in routers:
            p = r["per_token"]
            lines.append(
                f"{name:11} {r['tokens']:>6} {p['qsort']:>9.1f} {p['plain']:>9.1f} "
                f"{p['route_gate']:>10.1f} {r['route_gate_vs_qsort']:>8.2f}x "
                f"{r['route_gate_vs_plain']:>8.2f}x"
            )
    return "\n".join(lines)


def render_family(report: dict[str, Any]) -> str:
    """The --family table: every shape's columns, then min / median / max per board and scheme."""
    fam = report["family"]
    lines = [
        f"Expert kernels and forward pass, instructions / MAC, over a family of {fam['n']} "
        f"shapes (seed {fam['seed']}; toy seed layout, 2 experts; columns as in the one-shape "
        "table)",
        "",
        f"{'board':11} {'scheme':6} {'shape':24} " + " ".join(f"{c:>9}" for c in COLUMNS),
    ]
    for name, entry in report["boards"].items():
        if "skipped" in entry:
            lines.append(f"{name:11} {short_reason(entry['skipped'])}")
            continue
        for scheme, per_shape in entry["schemes"].items():
            for i, res in enumerate(per_shape):
                head = f"{name:11} {scheme:6} {shape_label(fam['shapes'][i]):24} "
                if "skipped" in res:
                    lines.append(head + short_reason(res["skipped"]))
                    continue
                lines.append(head + " ".join(f"{res['instr_per_mac'][c]:>9.2f}" for c in COLUMNS))
    lines += ["", "Over the family: min / median / max per column; worst: the largest slope"]
    for name, entry in report["boards"].items():
        for scheme, summ in entry.get("summary", {}).items():
            if "stats" not in summ:
                lines.append(f"{name:11} {scheme:6} {summ['skipped']}")
                continue
            for stat in ("min", "median", "max"):
                lines.append(
                    f"{name:11} {scheme:6} {stat:24} "
                    + " ".join(f"{summ['stats'][c][stat]:>9.2f}" for c in COLUMNS)
                )
            w = summ["worst"]
            lines.append(
                f"{name:11} {scheme:6} {'worst: ' + w['shape']:24} "
                + " ".join(f"{w['instr_per_mac'][c]:>9.2f}" for c in COLUMNS)
            )
    return "\n".join(lines)


SWEEP_COLUMNS = ("pass@1", "slope", "kslope", "code", "stack", "cmsis", "x cmsis", "code x")


def sweep_row(res: dict[str, Any], cm: dict[str, Any] | None) -> dict[str, float | None]:
    """One sweep case's columns: Colibri's whole-pass figures and its kernel's code and stack,
    CMSIS-NN's slope, and the ratios (Colibri's whole-pass slope / CMSIS-NN's kernel slope; code
    of the expert kind / code of the pair)."""
    ipm = res["instr_per_mac"]
    k = res.get("kernel") or {}
    row: dict[str, float | None] = {
        "pass@1": ipm["pass@1"],
        "slope": ipm["slope"],
        "kslope": ipm["kslope"],
        "code": k.get("code"),
        "stack": k.get("stack"),
        "cmsis": None,
        "x cmsis": None,
        "code x": None,
    }
    if cm and "skipped" not in cm:
        row["cmsis"] = cm["instr_per_mac"]["slope"]
        row["x cmsis"] = ipm["slope"] / cm["instr_per_mac"]["slope"]
        if k.get("code"):
            row["code x"] = k["code"] / cm["code"]
    return row


def _cell(v: float | None, c: str) -> str:
    if v is None:
        return f"{'-':>8}"
    return f"{int(v):>8}" if c in ("code", "stack") else f"{v:>8.2f}"


def sweep_summary(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Per board and scheme: cases measured / skipped, min / median / max of every column, and
    the worst case of the slope and of the ratio to CMSIS-NN."""
    out: dict[str, Any] = {}
    for case in cases:
        key = f"{case['board']} {case['scheme']}"
        out.setdefault(key, {"measured": 0, "skipped": 0, "rows": []})
        if "row" in case:
            out[key]["measured"] += 1
            out[key]["rows"].append((case["label"], case["row"]))
        else:
            out[key]["skipped"] += 1
    for entry in out.values():
        rows = entry.pop("rows")
        entry["stats"] = {}
        for c in SWEEP_COLUMNS:
            v = np.array([r[c] for _, r in rows if r[c] is not None], dtype=float)
            if len(v):
                entry["stats"][c] = {
                    "min": float(v.min()),
                    "median": float(np.median(v)),
                    "max": float(v.max()),
                }
        for c in ("slope", "x cmsis", "code x", "stack"):
            have = [(lbl, r) for lbl, r in rows if r[c] is not None]
            if have:
                lbl, r = max(have, key=lambda lr: float(lr[1][c] or 0.0))
                entry[f"worst {c}"] = {"shape": lbl, "value": r[c]}
    return out


def render_sweep(report: dict[str, Any]) -> str:
    sw = report["sweep"]
    lines = [
        f"Sweep: {sw['n']} shapes (seed {sw['seed']}), every board and scheme asked; whole-pass "
        "instr/MAC (pass@1, slope), the kernels' slope (kslope), code bytes reached from one "
        "expert kernel and its worst-case stack; with --cmsis-nn, CMSIS-NN's fully-connected pair "
        "(slope, Colibri slope / CMSIS slope, code / code of the pair)",
        "",
        f"{'board':11} {'scheme':6} {'shape':30} " + " ".join(f"{c:>8}" for c in SWEEP_COLUMNS),
    ]
    for case in sw["cases"]:
        head = f"{case['board']:11} {case['scheme']:6} {case['label']:30} "
        if "row" not in case:
            lines.append(head + short_reason(case["skipped"]))
            continue
        lines.append(head + " ".join(_cell(case["row"][c], c) for c in SWEEP_COLUMNS))
    lines += ["", "Worst case per board and scheme (min / median / max of each column)"]
    for key, entry in sw["summary"].items():
        lines.append(f"{key}: {entry['measured']} measured, {entry['skipped']} skipped")
        for c, st in entry["stats"].items():
            lines.append(f"    {c:8} {st['min']:>10.2f} {st['median']:>10.2f} {st['max']:>10.2f}")
        for c in ("slope", "x cmsis", "code x", "stack"):
            if f"worst {c}" in entry:
                w = entry[f"worst {c}"]
                lines.append(f"    worst {c}: {w['value']:.2f} at {w['shape']}")
    cases = sw["cases"]
    checked = [c for c in cases if "row" in c]
    exact = sum(
        1
        for c in checked
        if all(m["ok"] and m["how"] == "bit-exact" for m in c["colibri"]["mirror"])
    )
    within = sum(
        1
        for c in checked
        if all(m["ok"] for m in c["colibri"]["mirror"])
        and any(m["how"] != "bit-exact" for m in c["colibri"]["mirror"])
    )
    failed = sum(1 for c in cases if "failed" in c.get("colibri", {}))
    lines += [
        "",
        f"Against the mirror (colibri.reference.kernels.quant_moe_forward, every run of a case): "
        f"{len(cases)} cases, {len(checked)} measured: {exact} bit-exact (int8 activations), "
        f"{within} within LAYER_TOLERANCE (fp32 activations); {failed} failed to generate, build "
        f"or run; {len(cases) - len(checked) - failed} skipped (the board's budget or toolchain)",
    ]
    problems = sw.get("problems", [])
    lines.append(f"Problems: {len(problems)}" + (":" if problems else ""))
    lines += [f"    {why}" for why in problems]
    return "\n".join(lines)


def ready_board(name: str) -> tuple[Board | None, str]:
    """The board, or None and why it is skipped (its toolchain or emulator missing; said on
    stderr)."""
    board = load_board(name)
    ok, why = board.can_build()
    if ok:
        ok, why = board.can_run()
    if not ok:
        print(f"{name}: skipped: {why}", file=sys.stderr, flush=True)
        return None, why
    return board, ""


def sweep_label(shape: dict[str, Any], experts: int, chunk: int = max(TOKENS)) -> str:
    """The case's shape, its experts and, when smaller than the longest pass, its chunk."""
    return f"{shape_label(shape)} e{experts}" + (f" t{chunk}" if chunk < max(TOKENS) else "")


def case_problems(res: dict[str, Any]) -> list[str]:
    """What keeps a sweep case from issue 40's goal: a generate / build / run failure, a run whose
    output differs from the mirror, a weight part stored in the generic layout on a board with a
    fast one. A case skipped for want of room (the board's budget) is none."""
    if "failed" in res:
        return [f"failed: {res['failed']}"]
    out = [
        f"mirror ({m['how']}), {m['run']} tokens: {m['error']}"
        for m in res.get("mirror", [])
        if not m["ok"]
    ]
    if res.get("generic"):
        out.append(f"generic layout rows: {', '.join(res['generic'])}")
    return out


def run_sweep(a: argparse.Namespace, report: dict[str, Any]) -> int:
    """--sweep: every case of the drawn family on every board and scheme asked (see the module
    docstring); the report's "sweep" part, its table on stdout, JSON + PNG with --json."""
    shapes = sweep_shapes(a.sweep, a.seed)
    cmsis = Path(a.cmsis_nn) if a.cmsis_nn else None
    if cmsis is not None and not (cmsis / CMSIS_SOURCES[0]).is_file():
        print(f"colibri: --cmsis-nn {cmsis}: no {CMSIS_SOURCES[0]} there", file=sys.stderr)
        return 2
    work = Path(a.workdir) / f"sweep{a.sweep}-seed{a.seed}"
    cases: list[dict[str, Any]] = []
    report["sweep"] = {"n": a.sweep, "seed": a.seed, "shapes": shapes, "cases": cases}
    for name in a.board or SWEEP_BOARDS:
        board, why = ready_board(name)
        if board is None:
            cases.append({"board": name, "scheme": "*", "label": "*", "skipped": why})
            continue
        for scheme in a.scheme or SCHEMES:
            for i, shape in enumerate(shapes):
                where = work / name / scheme / f"shape{i}"
                try:
                    res = measure_fitting(board, scheme, shape, where)
                except (ColibriError, SystemExit) as exc:  # a build / run failure: a finding
                    res = {"failed": f"{type(exc).__name__}: {str(exc)[-600:]}"}
                case: dict[str, Any] = {
                    "board": name,
                    "scheme": scheme,
                    "shape": i,
                    "label": sweep_label(
                        shape,
                        res.get("experts", shape["experts"]),
                        res.get("max_tokens", max(TOKENS)),
                    ),
                    "macs_per_token": shape["macs_per_token"],
                    "colibri": res,
                }
                problems = case_problems(res)
                if problems:
                    case["problems"] = problems
                if "skipped" in res or "failed" in res:
                    case["skipped"] = res.get("skipped") or res["failed"]
                else:
                    cm = None
                    if cmsis is not None:
                        try:
                            cm = measure_cmsis(board, scheme, shape, cmsis, where / "cmsis")
                        except SystemExit as exc:  # e.g. its buffers overflow the board's RAM
                            cm = {"skipped": f"CMSIS-NN: {exc}"}
                        case["cmsis"] = cm
                    case["row"] = sweep_row(res, cm)
                cases.append(case)
                shown = case.get("skipped") or {
                    c: None if v is None else round(v, 2) for c, v in case["row"].items()
                }
                print(f"{name} {scheme} {case['label']}: {shown}", file=sys.stderr, flush=True)
                for why in problems:
                    print(f"  PROBLEM {why}", file=sys.stderr, flush=True)
    report["sweep"]["summary"] = sweep_summary(cases)
    problems = [
        f"{c['board']} {c['scheme']} {c['label']}: {p}"
        for c in cases
        for p in c.get("problems", [])
    ]
    report["sweep"]["problems"] = problems
    print(render_sweep(report))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
        series: dict[str, tuple[list[float], list[float]]] = {}
        for case in cases:
            if "row" not in case:
                continue
            key = f"{case['board']} {case['scheme']}"
            series.setdefault(key, ([], []))
            series[key][0].append(case["macs_per_token"])
            series[key][1].append(case["row"]["slope"])
            if case["row"]["cmsis"] is not None:
                ck = f"{case['board']} CMSIS-NN {CMSIS_FC[case['scheme']]}"
                series.setdefault(ck, ([], []))
                series[ck][0].append(case["macs_per_token"])
                series[ck][1].append(case["row"]["cmsis"])
        plots.scatter_plot(
            a.json,
            series,
            title=f"Whole-pass instructions per MAC over the sweep (seed {a.seed})",
            xlabel="MACs per token",
            ylabel="instructions / MAC (1-vs-9-token slope)",
        )
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_board_argument(
        p,
        None,
        action="append",
        help=board_help(None, f"board (repeatable; default {', '.join(BOARDS)})"),
    )
    p.add_argument("--scheme", action="append", choices=SCHEMES, help="(repeatable; default all)")
    p.add_argument("--json", help="also write the table as JSON to this path")
    p.add_argument("--tiny", action="store_true", help="small model, short router run (tests)")
    p.add_argument("--no-router", action="store_true", help="leave the router columns out")
    p.add_argument(
        "--family",
        type=int,
        metavar="N",
        help="measure N seeded random shapes (odd sizes, relu / silu / gelu, k 1 / 2) instead of "
        "the one; no router",
    )
    p.add_argument(
        "--sweep",
        type=int,
        metavar="N",
        help="N seeded shapes (d_model, d_ff 16..1024, every activation, k 1 / 2, 4-16 experts) on "
        f"every MCU board ({', '.join(SWEEP_BOARDS)}) and scheme: instr/MAC, code and stack",
    )
    p.add_argument(
        "--cmsis-nn",
        metavar="DIR",
        help="with --sweep: a CMSIS-NN checkout; its s8 / s4 fully-connected pair is built and "
        "counted beside every int8 / int4 case on the Arm boards",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="the --family / --sweep generator's seed (default 0)"
    )
    p.add_argument("--workdir", default=str(ROOT / "build" / "kernels_table"))
    a = p.parse_args(argv)
    if a.family is not None and (a.family < 1 or a.tiny):
        p.error("--family takes N >= 1 and does not go with --tiny")
    if a.sweep is not None and (a.sweep < 1 or a.tiny or a.family):
        p.error("--sweep takes N >= 1 and goes with neither --tiny nor --family")
    if a.cmsis_nn and not a.sweep:
        p.error("--cmsis-nn goes with --sweep")
    shapes = family_shapes(a.family, a.seed) if a.family else [model_shape(a.tiny)]
    report: dict[str, Any] = {
        "model": shapes[0],
        "definitions": {
            **{
                f"kernel@{n}": "instructions inside the calls of the generated expert kernels "
                f"(<name>_expert_<i>, callees included) during a {n}-token forward pass "
                f"/ ({n} * MACs per token)"
                for n in (1, 8)
            },
            **{
                f"pass@{n}": f"instructions of the whole {n}-token forward pass "
                f"/ ({n} * MACs per token)"
                for n in (1, 8)
            },
            "slope": "(pass instructions at 9 tokens - at 1 token) / 8 / MACs per token",
            "kslope": "(kernel instructions at 9 tokens - at 1 token) / 8 / MACs per token",
            "group8": "instructions inside one call of expert 0's kernel with 8 tokens (all 8 "
            "routed to expert 0) / (8 * MACs per token)",
            "g8/k1": "group8 / kernel@1",
            "router": "router_table.py: instructions per token, 64 experts, k 2",
        },
        "boards": {},
    }
    if a.sweep:
        return run_sweep(a, report)
    if a.family:
        report["family"] = {"n": a.family, "seed": a.seed, "shapes": shapes}
        work = Path(a.workdir) / f"family{a.family}-seed{a.seed}"
    else:
        work = Path(a.workdir) / ("tiny" if a.tiny else "full")
    for name in a.board or BOARDS:
        board, why = ready_board(name)
        if board is None:
            report["boards"][name] = {"skipped": why}
            continue
        entry: dict[str, Any] = {
            "counted_by": "callgrind" if board.kind == "host" else "QEMU icount",
            "schemes": {},
        }
        report["boards"][name] = entry
        for scheme in a.scheme or SCHEMES:
            results = []
            for i, shape in enumerate(shapes):
                where = work / name / f"shape{i}" if a.family else work / name
                try:
                    res = measure_scheme(board, scheme, shape, where)
                except ColibriError as exc:
                    print(f"colibri: {name} {scheme}: {exc}", file=sys.stderr)
                    return 1
                results.append(res)
                shown = res.get("skipped") or {
                    k: round(v, 2) for k, v in res["instr_per_mac"].items()
                }
                label = f" {shape_label(shape)}" if a.family else ""
                print(f"{name} {scheme}{label}: {shown}", file=sys.stderr, flush=True)
            if a.family:
                entry["schemes"][scheme] = results
                entry.setdefault("summary", {})[scheme] = family_summary(
                    list(zip(shapes, results, strict=True))
                )
            else:
                entry["schemes"][scheme] = results[0]
        if not a.no_router and not a.family:
            entry["router"] = measure_router(board, a.tiny, work / name / "router")
    text = render_family(report) if a.family else render(report)
    print(text)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
