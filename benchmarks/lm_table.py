"""Text generation with the whole generated transformer, fp32 and with int8 routed experts
(``--quant int8``, and ``int8+d``: ``--quant int8 --dense-quant int8``, every matrix int8):
tokens/s on the host, instructions per generated token on the host
(callgrind) and on cortex-m7 (QEMU TCG plugin), firmware flash / RAM (KV cache included), top-1
agreement of next-token predictions with transformers' fp32 logits (the numpy model of that
scheme at every position of 16 seeded 32-token prompts) and whether the C greedy continuation
equals transformers' (fp32) or the numpy int8 mirror's (int8, with its agreement with
transformers' greedy tokens).

Models are seeded tiny checkpoints built with transformers (tests/hf_tiny.py), trained 400
steps on their synthetic language (hf_tiny.trained_model; top-1 over held-out sentences of it)
or, with --untrained, left at the std-0.3 random weights of the fp32 tests (top-1 over random
prompts: near-tie next-token choices, the worst case for quantisation). ``tiny`` is the test
suite's Mixtral (d_model 16, 2 layers, 4 experts, k 2, vocab 64), ``tiny-q`` / ``tiny-o`` its
Qwen2-MoE (shared expert, moe d_ff 12) / OLMoE (QK-norm) of the same size; ``small`` is a Mixtral
with d_model 64, 2 layers, 8 experts (d_ff 64), k 2, vocab 256. Instructions per token are the
mean over the decode steps of a run generating --new-tokens after an 8-token prompt; host
tokens/s the mean over --host-tokens decode steps (attention grows with the position, so both
depend on the context length).

    python benchmarks/lm_table.py [--new-tokens 32] [--host-tokens 256] [--untrained]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from colibri.boards import load_board  # noqa: E402
from colibri.cli.pipeline import generate as generate_c  # noqa: E402
from colibri.errors import ColibriError  # noqa: E402
from colibri.frontends.hf_model import load_hf_transformer  # noqa: E402
from colibri.ir.transformer import MoETransformer  # noqa: E402
from colibri.options import GenerateOptions  # noqa: E402
from colibri.quant.model import quantize_transformer  # noqa: E402
from colibri.reference.transformer import forward, generate  # noqa: E402
from colibri.targets.build import build_model  # noqa: E402
from colibri.targets.lmrun import SamplingOptions, run_lm, write_lm_input  # noqa: E402
from colibri.targets.qemu import run_elf  # noqa: E402
from colibri.targets.size import size_report  # noqa: E402
from hf_tiny import ToyLanguage, make_model, save_model, trained_model  # noqa: E402

MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny": ("mixtral", {}),
    "tiny-q": ("qwen2_moe", {}),
    "tiny-o": ("olmoe", {}),
    "small": (
        "mixtral",
        {
            "hidden_size": 64,
            "intermediate_size": 64,
            "num_local_experts": 8,
            "vocab_size": 256,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
    ),
}
PROMPT = [1, 5, 9, 17, 33, 2, 7, 11]


def _hf_greedy(model: Any, n_new: int) -> list[int]:
    import torch

    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(n_new):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(PROMPT) :]


#: Row label -> (--quant, --dense-quant).
QUANTS = {"fp32": ("fp32", "fp32"), "int8": ("int8", "fp32"), "int8+d": ("int8", "int8")}


def _quant(model: MoETransformer, label: str) -> Any:
    quant, dense = QUANTS[label]
    return quantize_transformer(model, quant, dense=dense) if label != "fp32" else None


def _top1_agreement(hf: Any, model: MoETransformer, quant: str, lang: ToyLanguage | None) -> float:
    """Top-1 agreement of the numpy model (row label quant) with transformers' fp32 logits over
    every position of 16 seeded 32-token prompts (sentences of `lang`, or random ids)."""
    import numpy as np
    import torch

    q = _quant(model, quant)
    same = total = 0
    vocab = model.config.vocab_size
    for s in range(16):
        rng = np.random.default_rng(900 + s)
        seq = lang.sample(rng, 1, 32)[0] if lang else rng.integers(0, vocab, 32)
        prompt = [int(t) for t in seq]
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0].double().numpy()
        same += int((forward(model, prompt, quant=q).argmax(1) == ref.argmax(1)).sum())
        total += len(prompt)
    return same / total


def _host_tokens_per_s(gen: Path, n: int) -> float:
    """Decode tokens/s of the built host runner: a run generating n tokens minus a run
    generating 1 (process start-up and prefill), best of 5 each; SCons stays out of the timing."""
    exe = build_model(gen, "host")
    board = load_board("host")
    best: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as work_name:
        work = Path(work_name)
        for count in (1, n):
            write_lm_input(work / "input.bin", PROMPT, count, SamplingOptions(), False)
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                run_elf(board, exe, work)
                times.append(time.perf_counter() - t0)
            best[count] = min(times)
    return (n - 1) / (best[n] - best[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.rsplit("\n\n", 1)[0])  # not the usage line
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--host-tokens", type=int, default=256)
    ap.add_argument("--untrained", action="store_true", help="random std-0.3 weights")
    args = ap.parse_args()
    print(
        f"{'model':6} {'quant':6} {'board':11} {'flash':>9} {'RAM':>8} {'KV cache':>9} "
        f"{'tokens/s':>10} {'instr/token':>12} {'top-1':>7}  greedy {args.new_tokens}"
    )
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for label, (arch, overrides) in MODELS.items():
            lang: ToyLanguage | None = None
            if args.untrained:
                hf = make_model(arch, seed=1, **overrides)
            else:
                hf, lang, _ = trained_model(arch, 1, **overrides)
            ckpt = save_model(hf, tmp / label / "ckpt")
            model = load_hf_transformer(ckpt)
            want = _hf_greedy(hf, args.new_tokens)
            for quant in QUANTS:
                top1 = f"{100 * _top1_agreement(hf, model, quant, lang):.2f}%"
                mirror = want
                if quant != "fp32":
                    q = _quant(model, quant)
                    mirror = generate(model, PROMPT, args.new_tokens, quant=q)[len(PROMPT) :]
                for board in ("host", "cortex-m7"):
                    b = load_board(board)
                    ok, why = b.can_build()
                    if ok:
                        ok, why = b.can_run()
                    row = f"{label:6} {quant:6} {board:11}"
                    if not ok:
                        print(f"{row} unavailable: {why.split('. ')[0]}")
                        continue
                    ctx = len(PROMPT) + (args.host_tokens if board == "host" else args.new_tokens)
                    try:
                        opts = GenerateOptions(
                            board=board, name="lm", max_context=max(ctx, 64),
                            quant=QUANTS[quant][0], dense_quant=QUANTS[quant][1],
                        )  # fmt: skip
                        gen, manifest = generate_c(model, tmp / label / quant / board, opts)
                        count = True  # callgrind on the host, the TCG plugin under QEMU
                        out, res = run_lm(
                            gen, board, PROMPT, args.new_tokens, count_instructions=count
                        )
                        rep = size_report(gen, board)
                    except ColibriError as exc:
                        print(f"{row} error: {exc}")
                        continue
                    tps = (
                        f"{_host_tokens_per_s(gen, args.host_tokens):.0f}"
                        if board == "host"
                        else "-"
                    )
                    ipt = (
                        f"{res.instructions // (args.new_tokens - 1)}"
                        if count and res.instructions and args.new_tokens > 1
                        else "-"
                    )
                    got = out.tokens.tolist()
                    if quant == "fp32":
                        same = "= transformers" if got == want else "differs from transformers"
                    else:
                        n_hf = sum(a == b for a, b in zip(got, want))
                        same = "= int8 mirror" if got == mirror else "differs from int8 mirror"
                        same += f" ({n_hf}/{len(want)} tokens = transformers)"
                    print(
                        f"{row} {rep.flash_used:>9} {rep.ram_used:>8} "
                        f"{manifest['memory']['kv_cache_bytes']:>9} {tps:>10} {ipt:>12} "
                        f"{top1:>7}  {same}"
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
