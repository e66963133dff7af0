"""Text generation with the whole generated transformer: tokens/s on the host, instructions
per generated token on the host (callgrind) and on cortex-m7 (QEMU TCG plugin), firmware
flash / RAM (KV cache included) and greedy agreement with transformers.

Models are seeded random tiny checkpoints built with transformers (tests/hf_tiny.py):
``tiny`` is the test suite's Mixtral (d_model 16, 2 layers, 4 experts, k 2, vocab 64); ``small``
is a Mixtral with d_model 64, 2 layers, 8 experts (d_ff 64), k 2, vocab 256. Instructions per
token are the mean over the decode steps of a run generating --new-tokens after an 8-token
prompt; host tokens/s the mean over --host-tokens decode steps (attention grows with the
position, so both depend on the context length).

    python benchmarks/lm_table.py [--new-tokens 32] [--host-tokens 256]
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
from colibri.build import build_model  # noqa: E402
from colibri.errors import ColibriError  # noqa: E402
from colibri.lmgen import generate_transformer  # noqa: E402
from colibri.lmrun import SamplingOptions, run_lm, write_lm_input  # noqa: E402
from colibri.qemu import run_elf  # noqa: E402
from colibri.size import size_report  # noqa: E402
from colibri.transformer import load_hf_transformer  # noqa: E402
from hf_tiny import make_model, save_model  # noqa: E402

MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny": ("mixtral", {}),
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
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--host-tokens", type=int, default=256)
    args = ap.parse_args()
    print(
        f"{'model':6} {'board':11} {'flash':>9} {'RAM':>8} {'KV cache':>9} {'tokens/s':>10} "
        f"{'instr/token':>12}  greedy {args.new_tokens} = transformers"
    )
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for label, (arch, overrides) in MODELS.items():
            hf = make_model(arch, seed=1, **overrides)
            ckpt = save_model(hf, tmp / label / "ckpt")
            model = load_hf_transformer(ckpt)
            want = _hf_greedy(hf, args.new_tokens)
            for board in ("host", "cortex-m7"):
                b = load_board(board)
                ok, why = b.can_build()
                if ok:
                    ok, why = b.can_run()
                if not ok:
                    print(f"{label:6} {board:11} unavailable: {why.split('. ')[0]}")
                    continue
                ctx = len(PROMPT) + (args.host_tokens if board == "host" else args.new_tokens)
                try:
                    gen, manifest = generate_transformer(
                        model, tmp / label / board, board, "lm", max(ctx, 64)
                    )
                    count = True  # callgrind on the host, the TCG plugin under QEMU
                    out, res = run_lm(gen, board, PROMPT, args.new_tokens, count_instructions=count)
                    rep = size_report(gen, board)
                except ColibriError as exc:
                    print(f"{label:6} {board:11} error: {exc}")
                    continue
                tps = f"{_host_tokens_per_s(gen, args.host_tokens):.0f}" if board == "host" else "-"
                ipt = (
                    f"{res.instructions // (args.new_tokens - 1)}"
                    if count and res.instructions and args.new_tokens > 1
                    else "-"
                )
                same = "yes" if out.tokens.tolist() == want else "NO"
                print(
                    f"{label:6} {board:11} {rep.flash_used:>9} {rep.ram_used:>8} "
                    f"{manifest['memory']['kv_cache_bytes']:>9} {tps:>10} {ipt:>12}  {same}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
