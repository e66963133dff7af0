"""`colibri run` on a generated transformer or a whole-model container (.clb version 2): its
options, tokens in, ids and text out.

The runner's file protocol and the tokenizer lookup are :mod:`colibri.targets.lmrun`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError
from ..frontends.load import save_npy
from ..options import MAX_CONTEXT_LIMIT
from ..progress import progress_for
from ..targets.lmrun import (
    SamplingOptions,
    byte_text,
    byte_tokens,
    format_expert_stats,
    format_ids,
    is_container_file,
    lm_file_manifest,
    parse_ids,
    resolve_tokenizer,
    run_lm,
    run_lm_file,
)
from .argtypes import (
    MAX_SAMPLING_TOP_K,
    MAX_SEED,
    MAX_TEMPERATURE,
    byte_size,
    float_range,
    int_range,
    pin_count,
)

if TYPE_CHECKING:
    from ..frontends.tokenizer import Tokenizer


def add_run_arguments(s: Any) -> None:
    """The text-generation options of the `run` subcommand (an argparse parser)."""
    s.add_argument("--prompt-ids", metavar="1,5,9", help="transformer: prompt token ids")
    s.add_argument(
        "--prompt",
        metavar="TEXT",
        help="transformer: the prompt as text, tokenized with --tokenizer, else the checkpoint's "
        "tokenizer.json, else one token per UTF-8 byte (vocabularies of >= 256 ids); the "
        "generated text is printed after the ids",
    )
    s.add_argument(
        "--tokenizer",
        metavar="FILE",
        help="transformer: a Hugging Face tokenizer.json (byte-level BPE, SentencePiece-style "
        "BPE, Unigram, ...) for --prompt and the printed text (default: the checkpoint's "
        "tokenizer.json)",
    )
    s.add_argument(
        "--max-new-tokens",
        type=int_range(0, MAX_CONTEXT_LIMIT, "tokens"),
        default=32,
        help="transformer: tokens to generate (0..1048576, default 32)",
    )
    s.add_argument(
        "--logits", metavar="L.npy", help="transformer: write the logits [T, vocab] of the prompt"
    )
    s.add_argument(
        "--temperature",
        type=float_range(0.0, MAX_TEMPERATURE),
        default=0.0,
        help="transformer: 0 = greedy (default; 0..10000)",
    )
    s.add_argument(
        "--top-k",
        type=int_range(0, MAX_SAMPLING_TOP_K),
        default=0,
        help="transformer: sample from the k best (0 = all, default; at most the vocabulary)",
    )
    s.add_argument(
        "--top-p",
        type=float_range(0.0, 1.0, lo_open=True),
        default=1.0,
        help="transformer: nucleus threshold (> 0 and <= 1, default 1)",
    )
    s.add_argument(
        "--seed",
        type=int_range(0, MAX_SEED),
        default=0,
        help="transformer: sampler seed (0..2**64-1, default 0)",
    )
    s.add_argument(
        "--ram-budget",
        type=byte_size(0, MAX_SEED),
        default=0,
        metavar="BYTES",
        help="model file (.clb): bytes of routed experts kept in RAM (e.g. 64M); the others "
        "stay in the file and pass through LRU slots, the same outputs; prints the slot "
        "counters (default 0: every expert resident)",
    )
    s.add_argument(
        "--no-prefetch",
        action="store_true",
        help="model file with --ram-budget: no prefetch of the next layer's predicted experts",
    )
    s.add_argument(
        "--threads",
        type=int_range(0, 256),
        default=0,
        metavar="N",
        help="model file (.clb) on the host / Linux boards: split the large matrices and the "
        "experts of a layer over N threads, the same outputs bit for bit (default 0: one)",
    )
    s.add_argument(
        "--max-context",
        type=int_range(0, MAX_CONTEXT_LIMIT),
        default=0,
        metavar="N",
        help="model file (.clb): KV cache positions to allocate (default 0: what the prompt and "
        "--max-new-tokens need; at most the file's --max-context)",
    )
    s.add_argument(
        "--max-memory",
        type=byte_size(0, MAX_SEED),
        default=0,
        metavar="BYTES",
        help="model file (.clb): ceiling on the runtime's allocations (e.g. 512M): a model "
        "that needs more is refused at load, with the bytes it needs (default 0: none)",
    )
    s.add_argument(
        "--pin",
        type=pin_count,
        default="auto",
        metavar="N|auto|0",
        help="model file with --ram-budget: slots pinned at load with the hottest experts of "
        "the file's calibration heat (`convert --calib`), never evicted: auto (default: up to "
        "half the slots, when the file has heat), 0 (none) or up to N",
    )


def _embedded_tokenizer(path: str, manifest: dict[str, Any]) -> Tokenizer | None:
    """The tokenizer.json a whole-model container carries (`convert` stores the checkpoint's),
    or None."""
    import tempfile

    from ..frontends.container import read_lm_tokenizer
    from ..frontends.tokenizer import load_tokenizer

    data = read_lm_tokenizer(path)
    if data is None:
        return None
    with tempfile.TemporaryDirectory(prefix="colibri-tok-") as tmp:
        file = Path(tmp) / "tokenizer.json"
        file.write_bytes(data)
        tok = load_tokenizer(file)
    tok.source = f"{path} (embedded tokenizer.json)"
    tok.check_vocab(int(manifest["model"]["config"]["vocab_size"]), "the model file")
    return tok


def cmd_run_lm(a: Any) -> int:
    """Generate from a prompt; prints the new ids space-separated on one line, then (with
    --prompt or --tokenizer) their text."""
    if getattr(a, "input", None) is not None or getattr(a, "routing", None) is not None:
        raise InputError(
            f"{a.dir} is a whole transformer: --input / --routing are for single MoE "
            f"layers; pass --prompt-ids 1,5,9 (or --prompt TEXT) instead"
        )
    if (a.prompt_ids is None) == (a.prompt is None):
        raise InputError(
            f"{a.dir} is a whole transformer: pass either --prompt-ids 1,5,9 or --prompt "
            f"TEXT (and optionally --max-new-tokens N); --input is for single MoE layers"
        )
    tok: Tokenizer | None = None
    explicit = getattr(a, "tokenizer", None)
    model_file = is_container_file(a.dir)  # a whole-model container (.clb version 2)
    if model_file:
        manifest = lm_file_manifest(a.dir)
    if a.prompt is not None or explicit is not None:
        from ..targets.build import check_generated

        if not model_file:
            manifest = check_generated(Path(a.dir).resolve())
        tok = _embedded_tokenizer(a.dir, manifest) if model_file and explicit is None else None
        if tok is None:
            tok = resolve_tokenizer(manifest, explicit)
        if tok is not None and a.verbose:
            print(f"colibri: tokenizer {tok.source}", file=sys.stderr)
    if a.prompt is not None:
        if tok is not None:
            prompt = tok.encode(a.prompt)
            if not prompt:
                raise InputError(f"--prompt {a.prompt!r} encodes to no tokens: pass some text")
        else:
            prompt = byte_tokens(a.prompt, int(manifest["model"]["config"]["vocab_size"]))
    else:
        prompt = parse_ids(a.prompt_ids)
    sampling = SamplingOptions(a.temperature, a.top_k, a.top_p, a.seed)
    # the build of a generated directory shows its progress (a container's runner is prebuilt)
    extra: dict[str, Any] = {}
    ram_budget = int(getattr(a, "ram_budget", 0) or 0)
    threads = int(getattr(a, "threads", 0) or 0)
    max_context = int(getattr(a, "max_context", 0) or 0)
    max_memory = int(getattr(a, "max_memory", 0) or 0)
    if not model_file:
        if max_context or max_memory:
            raise InputError(
                f"--max-context / --max-memory are for model files (`colibri convert CKPT "
                f"--out model.clb`); {a.dir} is generated C, whose KV cache and arena are "
                f"static, sized at generation (`generate --max-context N`)"
            )
        if threads > 1:
            raise InputError(
                f"--threads is for model files (`colibri convert CKPT --out model.clb`); "
                f"{a.dir} is generated C, which runs on one thread"
            )
        if ram_budget:
            raise InputError(
                f"--ram-budget is for model files (`colibri convert CKPT --out model.clb`); "
                f"{a.dir} is generated C, whose expert placement is fixed at generation"
            )
        extra["progress"] = progress_for(sys.stderr, getattr(a, "quiet", False))
    else:
        extra["ram_budget"] = ram_budget
        extra["prefetch"] = not getattr(a, "no_prefetch", False)
        extra["threads"] = threads
        extra["max_context"] = max_context
        extra["max_memory"] = max_memory
        extra["pin"] = getattr(a, "pin", "auto")
        if extra["pin"] not in ("auto", 0) and not ram_budget:
            raise InputError(
                f"--pin {extra['pin']} pins experts in the slots of --ram-budget; pass "
                f"--ram-budget BYTES too (without it every expert is resident)"
            )
    out, result = (run_lm_file if model_file else run_lm)(
        a.dir,
        a.board,
        prompt,
        a.max_new_tokens,
        sampling,
        want_logits=a.logits is not None,
        count_instructions=a.count_instructions,
        timeout=a.timeout,
        verbose=a.verbose,
        **extra,
    )
    print(format_ids(out.tokens))
    if out.expert_stats is not None:
        print(format_expert_stats(out.expert_stats), file=sys.stderr)
    if tok is not None:
        print(tok.decode(out.tokens.tolist()))
    elif a.prompt is not None:
        print(byte_text(out.tokens))
    if a.output:
        save_npy(a.output, out.tokens.astype(np.int32))
    if a.logits and out.logits is not None:
        save_npy(a.logits, out.logits)
    if a.count_instructions:
        steps = a.max_new_tokens - 1
        per = "n/a" if result.instructions is None or steps < 1 else result.instructions // steps
        print(f"instructions per generated token ({a.board}, decode step): {per}")
    return 0
