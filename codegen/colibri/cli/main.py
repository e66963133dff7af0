"""The `colibri` command line.

Imports: the modules every command line loads anyway (the argument types, the front ends, the
quantiser's schemes; :mod:`.inspect` and :mod:`.lm` add their parsers) are imported here. A
module only some commands need and that costs start-up time is imported inside the command
that uses it, so `colibri boards`, `--help` or a refused option answer without loading it
(measured after this module's imports, on an idle core): the pipeline (:mod:`.pipeline`,
~85 ms: Jinja2, the numpy reference, the reports), the ELF size report (``targets.size`` and
``report.sizes``, pyelftools, ~60 ms), the PyTorch export (:mod:`.export`, ~30 ms), the
builder (``targets.build``, ~20 ms), the version-2 model reader and the transformer reference
(``emit.lmfile``, ``reference.transformer``, ~25 ms), ``emit.output`` (Jinja2, ~25 ms) and the
accuracy and routing reports of `generate` (loaded with the pipeline). The console script
(:func:`colibri.cli.entry`) imports this module inside its Ctrl-C guard.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..boards import list_boards, load_board
from ..emit.cformat import MAX_NAME
from ..emit.container import container_bytes
from ..errors import ColibriError, ConfigError, InputError, OutputError, interrupted
from ..frontends.container import is_lm_container
from ..frontends.export import EXPORT_TOLERANCE
from ..frontends.hf import check_architectures, is_whole
from ..frontends.load import check_input, load_model, load_npy, save_npy, save_npz
from ..frontends.seed import make_toy, write_seed
from ..ir.moe import MAX_TOP_K
from ..options import MAX_CONTEXT_LIMIT as MAX_CONTEXT
from ..options import OPTIMIZE, GenerateOptions
from ..paths import check_output_file, check_output_parent, write_files_atomic
from ..plan.model import MAX_LRU_SLOTS
from ..plan.placement import format_placement_report
from ..progress import SILENT, model_bytes, progress_for
from ..quant.formats import SCHEMES
from ..quant.model import DENSE_SCHEMES
from ..reference.kernels import quant_moe_forward
from ..reference.moe import FP32_TOLERANCE, compare, moe_forward
from ..report.html import write_report
from ..targets.lmrun import is_container_file, parse_ids, read_output, write_input
from ..targets.qemu import run_elf
from .argtypes import (
    MAX_CHECK_TOKENS,
    MAX_LAYER,
    MAX_RAM_BUDGET,
    MAX_SEED,
    MAX_TIMEOUT,
    MAX_TOKENS,
    MAX_TOY_BYTES,
    MAX_TOY_DIM,
    MAX_TOY_EXPERTS,
    ColibriArgumentParser,
    add_board_argument,
    float_range,
    int_range,
    model_name,
)
from .inspect import add_parser as add_inspect_parser
from .lm import add_run_arguments, cmd_run_lm
from .verify import verify_model

#: --layer of every command: a decoder layer index (checked against the model when it is read).
LAYER = int_range(0, MAX_LAYER, "decoder layer index")
MOE_LAYER_HELP = "Hugging Face checkpoint: the decoder layer whose MoE block to use"


def add_quiet(s: argparse.ArgumentParser) -> None:
    """--quiet of the commands with long steps (colibri.progress)."""
    s.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress lines on stderr (shown only on a terminal, for a model of 4 MB or "
        "more or a step that takes over a second)",
    )


def _progress(a: argparse.Namespace, model: str | None = None) -> Any:
    """The command's progress reporter (colibri.progress): silent unless stderr is a terminal
    and --quiet was not given; every stage shows for a model file (or checkpoint directory) of
    PROGRESS_MIN_BYTES or more."""
    return progress_for(sys.stderr, a.quiet, model_bytes(model) if model else 0)


# -- commands ----------------------------------------------------------------------------------


def cmd_make_toy(a: argparse.Namespace) -> int:
    out = Path(a.out)
    check_output_file(out)  # not a device, FIFO, socket or a link out of its directory
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: is a file; make-toy --out takes a directory")
    floats = a.experts * (3 * a.hidden * a.ff + a.hidden + a.ff) + a.experts * (a.hidden + 1)
    if 4 * floats > MAX_TOY_BYTES:
        raise ConfigError(
            f"make-toy: --experts {a.experts} --hidden {a.hidden} --ff {a.ff} make "
            f"~{4 * floats} bytes of weights; a toy model is at most {MAX_TOY_BYTES} bytes "
            f"(1 GiB): choose smaller sizes"
        )
    layer = make_toy(
        experts=a.experts,
        hidden=a.hidden,
        ff=a.ff,
        top_k=a.top_k,
        activation=a.activation,
        seed=a.seed,
        norm_topk_prob=a.norm_topk,
        router_bias=a.router_bias,
    )
    created = not out.exists()
    try:
        if layer.config.gated:
            path = out / "model.clb"
            text = json.dumps(layer.config.to_json(), indent=2) + "\n"
            write_files_atomic({path: container_bytes(layer), out / "config.json": text.encode()})
        else:
            path = write_seed(layer, out)
    except BaseException:
        if created:  # nothing left behind, not even the directory
            shutil.rmtree(out, ignore_errors=True)
        raise
    c = layer.config
    print(
        f"wrote {path} ({c.n_experts} experts, d_model {c.d_model}, d_ff {c.d_ff}, "
        f"k {c.top_k}, {'swiglu' if c.gated else c.activation}, seed {a.seed})"
    )
    return 0


def cmd_convert(a: argparse.Namespace) -> int:
    """`colibri convert`: the pipeline (:func:`colibri.cli.pipeline.convert`), then one line
    saying what was written."""
    from .pipeline import convert

    check_output_file(a.out)  # before any work (the write checks again)
    opts = _quant_options(a)
    done = convert(a.model, a.out, opts, a.config, a.layer, _progress(a, a.model))
    path = done.path
    if done.layer is not None:
        stored = len(set(done.layer.storage_map()))
        print(
            f"wrote {path}: {path.stat().st_size} bytes, {done.layer.config.n_experts} experts "
            f"({stored} stored), 64-byte aligned blobs"
        )
        return 0
    c, q = done.config, done.q
    assert c is not None
    scheme = "fp32" if q is None else f"experts {q.scheme}, dense {q.dense_scheme}"
    print(
        f"wrote {path}: {path.stat().st_size} bytes, whole {c.architecture} ({c.n_layers} "
        f"layers, vocab {c.vocab_size}, {scheme}), RoPE tables for {opts.context} positions"
        f"{', tokenizer.json' if done.tokenizer else ''}"
        f"{', expert heat (hot experts pinned under --ram-budget)' if done.heat else ''}; run it "
        f"with `colibri run {a.out} --prompt-ids 1,5,9`"
    )
    return 0


def _check_generate_options(a: argparse.Namespace, whole: bool) -> None:
    """Options of the other kind of model are errors, not silently ignored."""
    if whole:
        others = {
            "--expert-quant": a.expert_quant is not None,
            "--cache": a.cache != "pinned",
            "--ram-budget": a.ram_budget is not None,
            "--psram-budget": a.psram_budget is not None,
        }
        given = [opt for opt, on in others.items() if on]
        if given:
            raise ConfigError(
                f"{', '.join(given)}: single MoE layer options (pass --layer N); a whole "
                f"transformer takes --quant, --act and --calib (token ids or text) for its routed "
                f"experts, --router-quant for its routers and --dense-quant for its other "
                f"matrices"
            )
        return
    whole_only = [
        opt
        for opt, on in (
            ("--max-context", a.max_context is not None),
            ("--dense-quant", a.dense_quant != "fp32"),
        )
        if on
    ]
    if whole_only:
        raise ConfigError(
            f"{' and '.join(whole_only)} {'apply' if len(whole_only) > 1 else 'applies'} to whole "
            f"transformers (a Hugging Face checkpoint directory without --layer); a single MoE "
            f"layer uses --max-tokens and --quant"
        )


def cmd_generate(a: argparse.Namespace) -> int:
    from ..frontends.hf import HFCheckpoint
    from ..frontends.hf_model import load_hf_config
    from ..reference.accuracy import format_accuracy
    from .pipeline import generate, load, streams

    board = load_board(a.board)
    check_architectures(a.model)
    _check_generate_options(a, is_whole(a.model, a.config, a.layer))
    progress = _progress(a, a.model)
    opts = _quant_options(
        a,
        board=board.name,
        name=a.name or Path(a.out).resolve().name,
        max_tokens=a.max_tokens,
        cache=a.cache,
        cache_slots=a.cache_slots if a.cache == "lru" else 0,
        ram_budget=a.ram_budget,
        psram_budget=a.psram_budget,
        optimize=a.optimize,
    )
    if streams(a.model, opts, a.config, a.layer):  # read layer by layer (memory: one layer)
        out, manifest = generate(a.model, a.out, opts, force=a.force, progress=progress)
        config = load_hf_config(HFCheckpoint(a.model))
        _print_transformer_summary(out, board.name, config, manifest)
        print(format_accuracy(manifest["accuracy"]))
        _print_routing(manifest)
        return 0
    model = load(a.model, a.config, a.layer, progress)
    out, manifest = generate(model, a.out, opts, force=a.force, progress=progress)
    if model.decoder is not None:
        _print_transformer_summary(out, board.name, model.decoder.config, manifest)
        if "accuracy" in manifest:
            print(format_accuracy(manifest["accuracy"]))
        _print_routing(manifest)
        return 0
    mem = manifest["memory"]
    c = model.layer.config
    print(
        f"generated {out} for {board.name}: {c.n_experts} experts "
        f"({manifest['model']['unique_experts']} stored), d_model {c.d_model}, d_ff {c.d_ff}, "
        f"k {c.top_k}; weights {mem['weight_bytes']} bytes (const), arena "
        f"{mem['arena_size']} bytes (static RAM, {mem['max_tokens']} tokens per chunk)"
    )
    if "accuracy" in manifest:
        print(format_placement_report(manifest))
        print(format_accuracy(manifest["accuracy"]))
    _print_routing(manifest)
    return 0


def _print_routing(manifest: dict[str, Any]) -> None:
    """The routing imbalance per MoE layer of `generate --calib` (report.routing)."""
    if "routing" in manifest:
        from ..report.routing import format_routing

        print(format_routing(manifest["routing"]))


def _print_transformer_summary(out: Path, board: str, c: Any, manifest: dict[str, Any]) -> None:
    mem = manifest["memory"]
    print(
        f"generated {out} for {board}: {c.architecture}, {c.n_layers} layers, d_model "
        f"{c.d_model}, vocab {c.vocab_size}; weights {mem['weight_bytes']} bytes (const), arena "
        f"{mem['arena_size']} bytes (static RAM: KV cache {mem['kv_cache_bytes']} bytes for "
        f"{mem['max_context']} positions + {mem['activation_bytes']} bytes of activations)"
    )
    qr = manifest.get("quantization")
    if qr is not None:
        dense = ""
        if qr["dense_scheme"] != "fp32":
            dense = (
                f", attention / shared experts / dense MLPs / embedding / LM head "
                f"{qr['dense_scheme']} ({qr['dense_act']} activations)"
            )
        if qr["router_scheme"] != "fp32":
            dense += f", routers {qr['router_scheme']}"
        print(
            f"routed experts {qr['scheme']} ({qr['act']} activations){dense}: weights "
            f"{qr['weight_bytes']} bytes instead of {qr['fp32_weight_bytes']} fp32 "
            f"({qr['bytes_saved']} saved)"
        )


def cmd_build(a: argparse.Namespace) -> int:
    from ..targets.build import build_model

    exe = build_model(a.dir, a.board, verbose=a.verbose, progress=_progress(a))
    print(f"built {exe}")
    return 0


def run_model(
    gen_dir: str | Path,
    board_name: str,
    x: np.ndarray,
    count_instructions: bool = False,
    timeout: float | None = None,
    verbose: bool = False,
    progress: Any = None,
) -> tuple[Any, Any]:
    """Build (incrementally) and run a generated model on a board; returns (RunOutput, result)
    (`progress`: a colibri.progress reporter for the build and run steps)."""
    from ..targets.build import build_model, check_generated

    gdir = Path(gen_dir).resolve()
    manifest = check_generated(gdir)
    d_model = int(manifest["model"]["config"]["hidden_size"])
    x = check_input(x, d_model)
    board = load_board(board_name)
    progress = progress or SILENT
    exe = build_model(gdir, board.name, verbose=verbose, progress=progress)
    with tempfile.TemporaryDirectory(prefix="colibri-run-") as tmp:
        work = Path(tmp)
        write_input(work / "input.bin", x)
        with progress.stage("run"):
            result = run_elf(
                board, exe, cwd=work, timeout=timeout, count_instructions=count_instructions
            )
        out = read_output(work / "output.bin")
    return out, result


def _check_output_files(*paths: str | None) -> None:
    """Refuse, before any work, output files that cannot be written where asked: a directory,
    a path under a file, a socket, block device or a link out of its directory (an existing
    character device or FIFO is written into: these outputs stream)."""

    for p in paths:
        if p is None:
            continue
        if check_output_file(p, stream=True):
            continue
        if Path(p).is_dir():
            raise OutputError(f"{p}: is a directory; pass a file path")
        check_output_parent(p, create=False)


def cmd_run(a: argparse.Namespace) -> int:
    from ..emit.output import manifest_kind
    from ..targets.build import check_generated

    _check_output_files(a.output, a.routing, a.logits)

    gen = Path(a.dir).resolve()
    if is_container_file(a.dir) or manifest_kind(check_generated(gen)) == "transformer":
        return cmd_run_lm(a)
    if a.input is None or a.output is None:
        raise InputError(
            f"{a.dir} is a single MoE layer: pass --input X.npy ([T, d_model] float32) and "
            f"--output Y.npy (--prompt-ids is for generated transformers)"
        )
    x = load_npy(a.input)
    out, result = run_model(
        a.dir, a.board, x, a.count_instructions, a.timeout, a.verbose, _progress(a)
    )
    save_npy(a.output, out.output)
    if a.routing:
        save_npz(a.routing, expert_ids=out.expert_ids, gates=out.gates)
    guest = (result.stdout or "").strip()
    if guest:
        print(guest)
    print(f"wrote {a.output}: output {list(out.output.shape)} float32")
    if a.routing:
        print(f"wrote {a.routing}: expert_ids {list(out.expert_ids.shape)}, gates")
    if a.count_instructions:
        print(f"instructions per forward pass ({a.board}): {result.instructions}")
    return 0


def _quant_options(a: argparse.Namespace, **extra: Any) -> Any:
    """GenerateOptions from the flags add_quant_args defines (shared by generate and
    reference, so the two always quantise alike) plus the command's own fields."""
    return GenerateOptions(
        quant=a.quant,
        expert_quant=a.expert_quant,
        act=a.act,
        calib=a.calib,
        router_quant=a.router_quant,
        max_context=a.max_context,
        dense_quant=a.dense_quant,
        scale_search=a.scale_search,
        calib_method=a.calib_method,
        **extra,
    )


def cmd_reference(a: argparse.Namespace) -> int:
    """The numpy reference of what `generate` would store with the same flags: a layer's
    output on --input rows, or a whole transformer's logits on --prompt-ids (and its greedy
    continuation), so a user can check their build (`colibri run`) against it."""
    from .pipeline import load

    if is_lm_container(a.model):
        return _reference_lm_file(a)
    if is_whole(a.model, a.config, a.layer):
        if a.input or a.output or a.routing:
            raise ConfigError(
                f"{a.model} is a whole transformer: pass --prompt-ids 1,5,9 with --logits L.npy "
                f"and/or --max-new-tokens N (--input / --output are for single MoE layers: add "
                f"--layer N for one layer's block)"
            )
        if a.prompt_ids is None or (a.logits is None and not a.max_new_tokens):
            raise ConfigError(
                "colibri reference CKPT needs --prompt-ids 1,5,9 and --logits L.npy and/or "
                "--max-new-tokens N"
            )
        _check_output_files(a.logits)
        progress = _progress(a, a.model)
        return _reference_transformer(a, load(a.model, progress=progress).decoder, progress)
    if a.input is None or a.output is None or a.prompt_ids or a.logits:
        raise ConfigError(
            "a single MoE layer takes --input X.npy --output Y.npy (--prompt-ids / --logits are "
            "for whole transformers: a Hugging Face checkpoint without --layer)"
        )
    _check_output_files(a.output, a.routing)
    progress = _progress(a, a.model)
    model = load(a.model, a.config, a.layer, progress)
    layer = model.layer
    x = check_input(load_npy(a.input), layer.config.d_model, a.input)
    opts = _quant_options(a, name="reference")
    if opts.quant == "fp32" and opts.expert_quant is None and opts.router_quant == "fp32":
        y, r = moe_forward(layer, x)
        ids, gates = r.expert_ids, r.gates
    else:
        from .pipeline import quantise

        lq = quantise(model, opts, progress=progress).q
        y, r = quant_moe_forward(layer, lq.experts, x, lq.router)
        ids, gates = r.expert_ids, r.gates
    save_npy(a.output, y.astype(np.float32))
    if a.routing:
        save_npz(a.routing, expert_ids=ids, gates=np.asarray(gates, np.float32))
    print(f"wrote {a.output}: reference output {list(y.shape)}")
    return 0


def _reference_lm_file(a: argparse.Namespace) -> int:
    """`colibri reference F.clb --prompt-ids ...` of a whole-model container (version 2): the
    numpy reference on the weights the file stores, quantised as they are (the flags it was
    converted with), so its logits are those of `colibri reference CKPT` with those flags."""
    from ..emit.lmfile import read_lm_model

    asked = [
        flag
        for flag, on in (
            ("--input", a.input is not None),
            ("--output", a.output is not None),
            ("--routing", a.routing is not None),
            ("--config", a.config is not None),
            ("--layer", a.layer is not None),
            ("--quant", a.quant != "fp32"),
            ("--expert-quant", a.expert_quant is not None),
            ("--router-quant", a.router_quant != "fp32"),
            ("--act", a.act is not None),
            ("--dense-quant", a.dense_quant != "fp32"),
            ("--calib", a.calib is not None),
            ("--scale-search", a.scale_search != "mse"),
            ("--calib-method", a.calib_method != "importance"),
            ("--max-context", a.max_context is not None),
        )
        if on
    ]
    if asked:
        raise ConfigError(
            f"{', '.join(asked)}: {a.model} is a whole-model container, whose weights, "
            f"quantisation and --max-context were fixed by `colibri convert`; pass only "
            f"--prompt-ids 1,5,9 with --logits L.npy and/or --max-new-tokens N"
        )
    if a.prompt_ids is None or (a.logits is None and not a.max_new_tokens):
        raise ConfigError(
            f"colibri reference {a.model} needs --prompt-ids 1,5,9 and --logits L.npy and/or "
            f"--max-new-tokens N"
        )
    _check_output_files(a.logits)
    progress = _progress(a, a.model)
    with progress.stage("load"):
        model, q, max_context = read_lm_model(a.model, lean=True)  # mapped: any size
    return _reference_generate(a, model, q, max_context, progress)


def _reference_transformer(a: argparse.Namespace, model: Any, progress: Any) -> int:
    from .pipeline import quantise_transformer

    opts = _quant_options(a, name="reference")
    _check_context(a, opts.context)
    q, _ = quantise_transformer(model, opts, progress=progress)
    return _reference_generate(a, model, q, opts.context, progress)


def _check_context(a: argparse.Namespace, max_context: int) -> list[int]:
    """The prompt ids; with --max-new-tokens they must fit the KV cache, as the C checks."""
    prompt = parse_ids(a.prompt_ids)
    if len(prompt) + a.max_new_tokens > max_context:
        raise InputError(
            f"{len(prompt)} prompt + {a.max_new_tokens} new tokens exceed --max-context "
            f"{max_context} (the generated C refuses the same request): raise --max-context"
        )
    return prompt


def _reference_generate(
    a: argparse.Namespace, model: Any, q: Any, max_context: int, progress: Any
) -> int:
    """The prompt's logits and the greedy continuation of the numpy reference."""
    from ..reference.transformer import KVCache, forward

    prompt = _check_context(a, max_context)
    cache = KVCache()
    new: list[int] = []
    # overflow on the way is reported as an error (NaN or Inf in a router input or the
    # logits), not as numpy's warnings
    with progress.stage("forward", 1 + a.max_new_tokens) as st, np.errstate(all="ignore"):
        logits = forward(model, prompt, cache, quant=q)
        st.update(1, f"prompt ({len(prompt)} tokens)")
        last = logits[-1]
        for i in range(a.max_new_tokens):  # greedy: the lowest id of equal logits, as the C
            new.append(int(np.argmax(last)))
            if i + 1 < a.max_new_tokens:
                last = forward(model, [new[-1]], cache, quant=q)[-1]
            st.update(2 + i, f"token {i + 1}/{a.max_new_tokens}")
    if a.logits:
        save_npy(a.logits, logits.astype(np.float32))
        print(f"wrote {a.logits}: reference logits {list(logits.shape)}")
    if a.max_new_tokens:
        print("generated ids: " + ",".join(str(t) for t in new))
    return 0


def cmd_boards(a: argparse.Namespace) -> int:
    rows = []
    for b in list_boards():
        ok_build, _ = b.can_build()
        ok_run, _ = b.can_run()
        mem = ", ".join(f"{n} {r.size // 1024} KB" for n, r in b.memory.items()) or "-"
        rows.append((b.name, b.kind, mem, "yes" if ok_build else "no", "yes" if ok_run else "no"))
    if a.json:
        print(
            json.dumps(
                [dict(zip(("name", "kind", "memory", "toolchain", "runner"), r)) for r in rows],
                indent=2,
            )
        )
        return 0
    head = ("board", "kind", "memory", "toolchain", "emulator")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(5)]
    for r in [head, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())
    missing = [b for b in list_boards() if not b.can_build()[0]]
    for b in missing:
        print(f"\n{b.can_build()[1]}")
    return 0


def cmd_size(a: argparse.Namespace) -> int:
    from ..targets.size import check_elf_budget, format_report, size_report

    rep = size_report(a.target, a.board)
    if a.json:
        print(json.dumps(rep.as_dict(), indent=2))
    else:
        print(format_report(rep))
    if a.html or a.svg:  # written before the budget check: most useful when it does not fit
        from ..report.sizes import size_html, size_svg

        for path, text in ((a.html, size_html), (a.svg, size_svg)):
            if path:
                out = write_report(path, text(rep))
                print(f"wrote {out}", file=sys.stderr if a.json else sys.stdout)
    check_elf_budget(rep)
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    """The README's main job: toy model -> generate -> build + run on host and a Cortex-M."""
    progress = _progress(a)
    work = Path(a.workdir).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    layer = make_toy(experts=8, hidden=32, ff=64, top_k=2, activation="gelu", seed=7)
    write_seed(layer, work / "toy")
    print(f"== 1. model: {work / 'toy'} (8 experts, d_model 32, d_ff 64, k 2, gelu)")
    layer = load_model(work / "toy" / "model.bin")
    x = np.random.default_rng(1).standard_normal((5, 32)).astype(np.float32)
    np.save(work / "x.npy", x)
    ref, routing = moe_forward(layer, x)
    failures = 0
    for step, board in enumerate(("host", a.board), start=2):
        from .pipeline import generate

        gen = work / f"gen-{board}"
        generate(
            layer, gen, GenerateOptions(board=board, name="demo", max_tokens=8), progress=progress
        )
        print(f"\n== {step}. generate + build + run on {board}: {gen}", flush=True)
        out, result = run_model(
            gen, board, x, count_instructions=board != "host", progress=progress
        )
        for t in range(x.shape[0]):
            ids = " ".join(str(v) for v in out.expert_ids[t])
            gates = " ".join(f"{v:.4f}" for v in out.gates[t])
            vals = " ".join(f"{v:+.4f}" for v in out.output[t, :6])
            print(f"  token {t}: experts [{ids}] gates [{gates}] y[:6] = {vals} ...")
        err = compare(out.output, ref)
        same = bool(np.array_equal(out.expert_ids, routing.expert_ids))
        print(
            f"  vs numpy reference: {'OK' if err is None else 'MISMATCH: ' + err} "
            f"(tolerance {FP32_TOLERANCE} x max|y|), routing identical: {same}"
        )
        if getattr(result, "instructions", None):
            print(f"  instructions for {x.shape[0]} tokens: {result.instructions}")
        failures += int(err is not None or not same)
        if board != "host":
            from ..targets.size import size_report_text

            print()
            print(size_report_text(gen, board))
    print("\ndemo " + ("passed" if failures == 0 else "FAILED"))
    return 0 if failures == 0 else 1


def cmd_verify(a: argparse.Namespace) -> int:
    verify_model(a.model, a.config, say=lambda line: print(line, flush=True))
    print("ok")
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    from .export import export

    check_output_file(a.out)  # before PyTorch is loaded (the write checks again)
    progress = _progress(a, a.source)
    if is_whole(a.source, a.config, a.layer):
        from .export import export_whole

        whole = export_whole(a.source, a.out, a.check_tokens, a.seed, progress)
        check = f"check of the C runtime on the file vs the numpy reference ({whole.tokens} tokens)"
        print(
            f"wrote {whole.path}: whole model, {whole.layers} layers (container version 2, fp32); "
            + (
                f"{check}: VACUOUS, every reference logit is 0, so equal logits verify nothing"
                if whole.vacuous
                else f"{check}: max |logit diff| {whole.max_abs_diff:.3g} OK"
            )
        )
        if whole.vacuous:
            _warn_vacuous(whole.path, "every logit of the model is zero")
        return 0
    res = export(a.source, a.out, a.layer, a.config, a.check_tokens, a.seed, progress)
    c = res.layer.config
    print(
        f"wrote {res.path}: {c.n_experts} experts, d_model {c.d_model}, d_ff {c.d_ff}, "
        f"k {c.top_k}, {res.layer.metadata.get('architecture', 'PyTorch')} block"
    )
    if res.vacuous:  # zeros against zeros: no OK for a check that verified nothing
        print(
            f"check vs PyTorch ({res.tokens} tokens): VACUOUS, PyTorch's output is all zeros "
            f"({res.vacuous_reason()}), so equal outputs verify nothing; the file is unchecked"
        )
        _warn_vacuous(res.path, res.vacuous_reason())
        return 0
    print(
        f"check vs PyTorch ({res.tokens} tokens): max |diff| {res.max_abs_diff:.3g} "
        f"(max |y| {res.max_abs_output:.3g}, tolerance {EXPORT_TOLERANCE} x max |y|) OK"
    )
    return 0


def _warn_vacuous(path: Path, reason: str) -> None:
    """The stderr line of an export whose check compared only zeros."""
    print(
        f"colibri: warning: {path}: the export check compared only zeros ({reason}); the file "
        f"was written but nothing was verified: check that the state_dict holds trained weights",
        file=sys.stderr,
    )


# -- parser ------------------------------------------------------------------------------------


def add_quant_args(s: argparse.ArgumentParser) -> None:
    """The quantisation flags of `generate`, which `reference` takes too (the same stages)."""
    s.add_argument(
        "--quant",
        default="fp32",
        choices=SCHEMES,
        help="expert weight scheme (default fp32; the router stays fp32). q4k: super-blocks of "
        "256 with 6-bit sub-block scales and minimums, 4.5 bits/weight, int8 activations",
    )
    s.add_argument(
        "--expert-quant",
        metavar="I=SCHEME,...",
        help="per-expert override, e.g. 3=int4,7=fp32",
    )
    s.add_argument(
        "--router-quant",
        choices=("fp32", "fp16", "int8"),
        default="fp32",
        help="router weights (default fp32; quantising them can flip routing: see the "
        "accuracy report's routing agreement)",
    )
    s.add_argument(
        "--act",
        choices=("fp32", "int8"),
        help="activations of int8/int4 matrices: int8 with one scale per block of 32 (integer "
        "dot products, the default) or fp32",
    )
    s.add_argument(
        "--dense-quant",
        choices=DENSE_SCHEMES,
        default="fp32",
        help="whole transformers: scheme of every matrix besides the routed experts (attention, "
        "shared expert, dense MLPs, embedding, LM head; default fp32; norms and routers stay "
        "fp32). int4 / q4k / q5k: the routed experts' 4- / 5-bit blocks (q4k and q5k with int8 "
        "activations only), e.g. --quant int4 --dense-quant int4 reads fewer bytes per token "
        "than llama.cpp's Q4_0",
    )
    s.add_argument(
        "--calib",
        metavar="FILE",
        help="calibration data: int8 / int4 experts are chosen by their error on the tokens "
        "routed to them (activation-aware scales), and the accuracy report and routing heat use "
        "it. A single MoE layer: [T, d_model] float32 .npy (default: 64 seeded random tokens "
        "for the report, no calibration); a whole transformer: token ids (integer .npy, 1-D or "
        "[N, T]) or a UTF-8 text file (tokenized with the checkpoint's tokenizer.json)",
    )
    s.add_argument(
        "--scale-search",
        choices=("mse", "none"),
        default="mse",
        help="int8 / int4 scales: mse (default) searches each int4 block's / int8 channel's "
        "scale for the least reconstruction error; none: the plain max|w| / 7 (int4) and "
        "max|w| / 127 (int8)",
    )
    s.add_argument(
        "--calib-method",
        choices=("importance", "gptq"),
        default="importance",
        help="with --calib, how int8 / int4 experts are chosen, each by its output error on "
        "the tokens routed to it: importance (default) weights the scale search by the "
        "expert's activation statistics from one pass of the calibration tokens (E[x^2] of its "
        "inputs, E[h^2] of its hidden channels) and measures the plain and uncalibrated scales "
        "and 3 activation-aware folds on a sample of those tokens; gptq adds error compensation "
        "(GPTQ: a second-order solve per matrix) and 9 folds, measured on more tokens (slower)",
    )
    s.add_argument(
        "--max-context",
        type=int_range(1, MAX_CONTEXT, "positions"),
        metavar="N",
        help="Hugging Face checkpoint without --layer (whole transformer): positions the KV "
        "cache holds, prompt + generated tokens (1..1048576, default 64)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = ColibriArgumentParser(
        prog="colibri",
        description="Colibri: compile a Mixture-of-Experts model into C for a board.",
    )
    p.add_argument("--version", action="version", version=f"colibri {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("make-toy", help="write a random toy model in the seed layout")
    s.add_argument("--out", required=True, help="output directory")
    s.add_argument(
        "--experts", type=int_range(1, MAX_TOY_EXPERTS), default=2, help="experts (1..1024)"
    )
    toy_dim = int_range(1, MAX_TOY_DIM)
    s.add_argument("--hidden", type=toy_dim, default=8, help="d_model (1..65536)")
    s.add_argument("--ff", type=toy_dim, default=16, help="d_ff (1..65536)")
    s.add_argument(
        "--top-k", type=int_range(1, MAX_TOP_K), default=1, help="experts per token (1..64)"
    )
    s.add_argument(
        "--activation", default="gelu", help="gelu (default), gelu_tanh, silu, relu or swiglu"
    )
    s.add_argument("--seed", type=int_range(0, MAX_SEED), default=0, help="0..2**64-1")
    s.add_argument("--norm-topk", action="store_true", help="renormalise the k gates")
    s.add_argument("--router-bias", action="store_true")
    s.set_defaults(func=cmd_make_toy)

    s = sub.add_parser("convert", help="write a model as a Colibri container (.clb)")
    s.add_argument("model")
    s.add_argument("--config", help="config.json (default: beside the model)")
    s.add_argument("--out", required=True, help="output .clb file")
    s.add_argument(
        "--layer",
        type=LAYER,
        help="Hugging Face checkpoint: the decoder layer whose MoE block to use (without it, "
        "a checkpoint is converted whole: container version 2, with generate's quantisation "
        "flags below)",
    )
    add_quant_args(s)
    add_quiet(s)
    s.set_defaults(func=cmd_convert)

    s = sub.add_parser("generate", help="emit C specialised to a model for a board")
    s.add_argument("model")
    s.add_argument("--config", help="config.json (default: beside the model)")
    add_board_argument(s, "host")
    s.add_argument("--out", required=True, help="output directory")
    s.add_argument(
        "--name",
        type=model_name,
        help=f"C name of the model, at most {MAX_NAME} characters (default: the output "
        "directory's name)",
    )
    s.add_argument(
        "--max-tokens",
        type=int_range(1, MAX_TOKENS, "tokens per chunk"),
        default=32,
        help="tokens per chunk the static buffers hold (1..1048576, default 32)",
    )
    s.add_argument("--force", action="store_true", help="replace a non-Colibri --out directory")
    add_quant_args(s)
    s.add_argument(
        "--cache",
        default="pinned",
        choices=("pinned", "lru", "none"),
        help="expert residency (the seeds' cache_policy; lru/none copy experts from flash "
        "into static RAM slots on use)",
    )
    s.add_argument(
        "--cache-slots",
        type=int_range(1, MAX_LRU_SLOTS, "LRU slots"),
        default=2,
        help="LRU slots (lru_cache_size, 1..256, default 2)",
    )
    s.add_argument(
        "--ram-budget",
        type=int_range(0, MAX_RAM_BUDGET, "bytes"),
        metavar="BYTES",
        help="RAM for pinning the hottest experts in (0..2**32-1). Default: without --calib "
        "0, every expert in flash; with --calib on a board with flash and RAM, half of the RAM "
        "the arena, the stack and 4 KB of runtime statics leave (the hottest experts that fit "
        "are pinned: a small model's all of them), on hosted boards 0. --ram-budget 0 keeps "
        "every expert in flash.",
    )
    s.add_argument(
        "--psram-budget",
        type=int_range(0, MAX_RAM_BUDGET, "bytes"),
        metavar="BYTES",
        help="boards with external PSRAM (esp32s3): bytes of the hottest experts that did not "
        "fit --ram-budget placed in PSRAM (section .colibri_psram) instead of flash. Default: "
        "with --calib the board's whole PSRAM, without 0 (every expert in flash).",
    )
    s.add_argument(
        "--optimize",
        choices=OPTIMIZE,
        default="speed",
        help="what the expert kernels favour: speed (default: the core's fast weight layouts "
        "and inline tiles, a kernel specialised per expert kind) or size (the portable layout "
        "on every core, each kind calling the library's matrix kernels, so kinds share code; "
        "`colibri size` prints the code each kind's kernel reaches)",
    )
    s.add_argument("--layer", type=LAYER, help=MOE_LAYER_HELP)
    add_quiet(s)
    s.set_defaults(func=cmd_generate)

    s = sub.add_parser("build", help="build a generated model for a board (SCons)")
    s.add_argument("dir")
    add_board_argument(s, "host")
    s.add_argument("-v", "--verbose", action="store_true")
    add_quiet(s)
    s.set_defaults(func=cmd_build)

    s = sub.add_parser("run", help="build and run a generated model on a board")
    s.add_argument("dir")
    add_board_argument(s, "host")
    s.add_argument("--input", help="MoE layer: [T, d_model] float32 .npy")
    s.add_argument(
        "--output",
        help="MoE layer: output .npy; transformer: also write the generated ids (int32 .npy)",
    )
    s.add_argument("--routing", help="also write expert_ids and gates [T, k] to this .npz")
    s.add_argument(
        "--count-instructions",
        action="store_true",
        help="report guest instructions of the forward pass (QEMU boards)",
    )
    s.add_argument(
        "--timeout",
        type=float_range(0.0, MAX_TIMEOUT, "seconds", lo_open=True),
        help="seconds (> 0 and <= 604800; default: the board's)",
    )
    s.add_argument("-v", "--verbose", action="store_true")
    add_run_arguments(s)
    add_quiet(s)
    s.set_defaults(func=cmd_run)

    s = sub.add_parser(
        "reference",
        help="run the numpy reference (the generated C's mirror, with the same quantisation "
        "flags as generate) on an input or a prompt",
    )
    s.add_argument(
        "model",
        help="a single MoE layer (seed layout, .npz, container), a Hugging Face checkpoint "
        "directory, or a whole-model container (`colibri convert CKPT --out lm.clb`: its stored "
        "weights as quantised, no quantisation flags)",
    )
    s.add_argument("--config")
    s.add_argument("--input", help="single MoE layer: input rows [T, d_model] .npy")
    s.add_argument("--output", help="single MoE layer: write the output [T, d_model] .npy")
    s.add_argument("--routing")
    s.add_argument("--prompt-ids", metavar="1,5,9", help="whole transformer: prompt token ids")
    s.add_argument(
        "--logits", metavar="L.npy", help="whole transformer: write the logits [T, vocab]"
    )
    s.add_argument(
        "--max-new-tokens",
        type=int_range(0, MAX_CONTEXT, "tokens"),
        default=0,
        metavar="N",
        help="whole transformer: greedy tokens to generate after the prompt (printed)",
    )
    add_quant_args(s)
    s.add_argument("--layer", type=LAYER, help=MOE_LAYER_HELP)
    add_quiet(s)
    s.set_defaults(func=cmd_reference)

    s = sub.add_parser(
        "export",
        help="PyTorch state_dict of an MoE block or HF checkpoint -> Colibri container",
    )
    s.add_argument("source", help="state_dict file (torch.save) or Hugging Face checkpoint dir")
    s.add_argument("--out", required=True, help="output .clb file")
    s.add_argument("--layer", type=LAYER, help="checkpoint directory: the decoder layer to export")
    s.add_argument("--config", help="state_dict: the model's Hugging Face config.json")
    s.add_argument(
        "--check-tokens",
        type=int_range(1, MAX_CHECK_TOKENS, "tokens"),
        default=8,
        help="tokens in the check vs PyTorch (1..65536, default 8)",
    )
    s.add_argument("--seed", type=int_range(0, MAX_SEED), default=0, help="seed of the check batch")
    add_quiet(s)
    s.set_defaults(func=cmd_export)

    s = sub.add_parser(
        "verify",
        help="check a model file completely (header, checksums, shapes, NaN/Inf): ok or the "
        "first problem",
    )
    s.add_argument(
        "model", help="container, seed layout (file or directory), .npz or HF checkpoint dir"
    )
    s.add_argument("--config", help="config.json (default: beside the model)")
    s.set_defaults(func=cmd_verify)

    add_inspect_parser(sub)

    s = sub.add_parser("boards", help="list boards, their memory and toolchain status")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_boards)

    s = sub.add_parser("size", help="flash/RAM report of a built ELF or generated directory")
    s.add_argument("target", help="firmware ELF, or a generated directory (built if needed)")
    add_board_argument(s, "host")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument(
        "--html",
        metavar="FILE",
        help="also write a self-contained HTML page: budget bars and treemaps of flash and RAM "
        "by section, runtime module and expert, and the report's tables",
    )
    s.add_argument("--svg", metavar="FILE", help="also write the bars and treemaps as an SVG")
    s.set_defaults(func=cmd_size)

    s = sub.add_parser("demo", help="toy model on the host and a Cortex-M board, with sizes")
    add_board_argument(s, "cortex-m4")
    s.add_argument("--workdir", default="build/demo")
    add_quiet(s)
    s.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command line; every error is one line, Ctrl-C at any moment (parsing included)
    is `colibri: interrupted` and status 130."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return interrupted()


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc: int = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return rc
    except BrokenPipeError:
        # `colibri size ... | head`: the reader has gone; stop quietly like other CLI tools
        # (128 + SIGPIPE), and point stdout at /dev/null so the exit flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except ColibriError as exc:
        print(f"colibri: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"colibri: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except MemoryError:
        print(
            "colibri: error: out of memory; the model or an option (a size, --max-tokens, "
            "--max-context) asks for more memory than this machine has",
            file=sys.stderr,
        )
        return 1
