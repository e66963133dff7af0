"""Train the small real-text MoE of the accuracy tests: tests/data/trained_moe/.

A transformers ``MixtralForCausalLM`` (8 experts, top-2) trained on Python's own documentation,
``pydoc_data.topics.topics`` (the help() topics, ~465 k characters of English and code, shipped
with every CPython, so nothing is downloaded). The topics are split by key: sorted keys, every
tenth from the fourth (index % 10 == 3) is held out (not seen by the tokenizer or the model);
the rest is held in (training and calibration). A byte-level BPE tokenizer (``tokenizers``,
vocab 1024, one special token ``<|endoftext|>`` = id 0 ending every topic) is trained on the
held-in topics, then the model on random 128-token crops of the held-in token stream (seeded
numpy crops, ``torch.manual_seed``, a fixed thread count, deterministic algorithms).

Outputs in --out (default tests/data/trained_moe):
  config.json, model.safetensors  the checkpoint, weights stored as fp16 (--dtype); loaded as
                                  fp32 they are exact, so colibri and transformers see the
                                  same fp32 model
  tokenizer.json                  the byte-level BPE tokenizer
  heldout.txt                     the held-out topics, each ended by <|endoftext|>
  calib.npy                       [CALIB_WINDOWS, CALIB_WINDOW] held-in token ids (int32):
                                  CALIB_WINDOWS sequences for --calib
  train_log.json                  sizes, training time, losses, held-out perplexity
  train_log.png                   the training loss curve (benchmarks/plots.py; skipped with a
                                  note without matplotlib); --plot-only redraws it from
                                  --out/train_log.json without training

The held-out perplexity reported is transformers' fp32 model on EVAL_WINDOWS evenly spaced
windows of EVAL_WINDOW tokens of heldout.txt (colibri.reference.lm_metrics), the windows
benchmarks/accuracy_table.py and tests/quant/test_trained_accuracy.py use.

    python benchmarks/train_trained_moe.py [--out DIR] [--size small|large|k256] [--steps 480]
                                           [--seed 0] [--corpus pydoc|stdlib] [--plot-only]

--corpus stdlib trains on the running Python's standard library sources instead (the first
STDLIB_CHARS characters of each top-level module, split by sorted file name the same way);
--seed changes the initial weights and the crops (default 0, the committed model).

The figures depend on the Python version (its pydoc topics), torch's CPU kernels and the thread
count; the committed files were made with CPython 3.11.7, torch 2.13.0 (CPU), transformers
5.24.0, tokenizers 0.23.3, 2 threads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "codegen"))

from colibri.reference.lm_metrics import perplexity, token_windows  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from plots import line_plot  # noqa: E402

DEFAULT_OUT = ROOT / "tests" / "data" / "trained_moe"
SEED = 0
EOT = "<|endoftext|>"
VOCAB = 1024
#: Sorted topic keys with index % HELDOUT_EVERY == HELDOUT_AT are held out.
HELDOUT_EVERY = 10
HELDOUT_AT = 3
SEQ = 128
BATCH = 16
CALIB_WINDOWS = 16
CALIB_WINDOW = 96
EVAL_WINDOWS = 8
EVAL_WINDOW = 96

MODEL_CONFIG: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=96,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_local_experts=8,
    num_experts_per_tok=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    router_aux_loss_coef=0.02,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=None,
)


#: --size large: the size class of issue 15's goals (about 3.6 M parameters, 4 layers, d 128,
#: experts 128 x 256). Too big to commit (7 MB as fp16); benchmarks/accuracy_table.py measures it.
LARGE_CONFIG: dict[str, Any] = dict(
    MODEL_CONFIG, hidden_size=128, intermediate_size=256, num_hidden_layers=4
)
#: --size k256: hidden and expert widths of 256, the super-block of llama.cpp's k-quants (rows
#: of other widths fall back to Q5_0 / Q5_1 / Q8_0 in llama-quantize), 1 layer (about 2.3 M
#: parameters): the family member on which Q4_K_M / Q5_K_M / Q6_K are really k-quants.
K256_CONFIG: dict[str, Any] = dict(
    MODEL_CONFIG, hidden_size=256, intermediate_size=256, num_hidden_layers=1
)
SIZES = {"small": MODEL_CONFIG, "large": LARGE_CONFIG, "k256": K256_CONFIG}
#: --corpus stdlib: the first STDLIB_CHARS characters of every top-level module of the running
#: Python's standard library (sorted file names; ~600 k characters of code on CPython 3.11).
STDLIB_CHARS = 4000
CORPORA = ("pydoc", "stdlib")


def corpus_texts(corpus: str = "pydoc") -> dict[str, str]:
    """The documents of a corpus by name: pydoc_data's help() topics, or the standard library's
    top-level modules (file name -> its first STDLIB_CHARS characters)."""
    if corpus == "pydoc":
        from pydoc_data.topics import topics

        return dict(topics)
    if corpus == "stdlib":
        import sysconfig

        lib = Path(sysconfig.get_paths()["stdlib"])
        return {
            p.name: p.read_text(encoding="utf-8", errors="replace")[:STDLIB_CHARS]
            for p in sorted(lib.glob("*.py"))
        }
    raise ValueError(f"unknown corpus {corpus!r} (one of {', '.join(CORPORA)})")


def split_topics(corpus: str = "pydoc") -> tuple[list[str], list[str]]:
    """(held-in texts, held-out texts) of a corpus (default pydoc_data's topics), by sorted key."""
    topics = corpus_texts(corpus)
    keys = sorted(topics)
    held_in = [topics[k] for i, k in enumerate(keys) if i % HELDOUT_EVERY != HELDOUT_AT]
    held_out = [topics[k] for i, k in enumerate(keys) if i % HELDOUT_EVERY == HELDOUT_AT]
    return held_in, held_out


def train_tokenizer(texts: list[str]) -> Any:
    """A byte-level BPE tokenizer (GPT-2 style) with VOCAB ids, id 0 = EOT."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(EOT) == 0 and tok.get_vocab_size() == VOCAB
    return tok


def encode_stream(tok: Any, texts: list[str]) -> np.ndarray:
    """Token ids of every text, each followed by EOT, as one int64 stream."""
    ids: list[int] = []
    for text in texts:
        ids += tok.encode(text).ids
        ids.append(0)
    return np.asarray(ids, dtype=np.int64)


def train(
    stream: np.ndarray,
    steps: int,
    lr: float,
    threads: int,
    config: dict[str, Any] = MODEL_CONFIG,
    log_every: int = 50,
    seed: int = SEED,
) -> tuple[Any, list[float], float]:
    """The trained model (eval mode, fp32), the loss every log_every steps, seconds; `seed`
    seeds the initial weights and the crops."""
    import torch
    import transformers

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    cfg = transformers.MixtralConfig(**config, output_router_logits=True)
    model = transformers.MixtralForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.05)
    warmup = max(1, steps // 20)

    def schedule(step: int) -> float:  # linear warm-up, cosine decay to 10 %
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    rng = np.random.default_rng(seed)
    losses: list[float] = []
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        starts = rng.integers(0, len(stream) - SEQ, BATCH)
        x = torch.from_numpy(np.stack([stream[s : s + SEQ] for s in starts]))
        out = model(x, labels=x)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % log_every == 0 or step == steps - 1:
            losses.append(round(out.loss.item(), 4))
            print(f"step {step}: loss {out.loss.item():.3f} ({time.perf_counter() - t0:.0f} s)")
    seconds = time.perf_counter() - t0
    model.config.output_router_logits = False
    return model.eval(), losses, seconds


def heldout_perplexity(model: Any, ids: np.ndarray) -> float:
    import torch

    windows = token_windows(ids, EVAL_WINDOWS, EVAL_WINDOW)
    with torch.no_grad():
        logits = model(torch.from_numpy(windows)).logits.double().numpy()
    return perplexity(list(logits), windows)


def loss_steps(n_losses: int, steps: int, every: int = 50) -> list[int]:
    """The training steps of the logged losses: every `every` steps from 0, and the last."""
    xs = list(range(0, steps, every))
    if (steps - 1) % every:
        xs.append(steps - 1)
    return xs if len(xs) == n_losses else [every * i for i in range(n_losses)]


def plot_train_log(json_path: Path) -> Path | None:
    """train_log.png beside train_log.json: the loss curve, with the held-out perplexity."""
    log = json.loads(json_path.read_text())
    losses = [float(v) for v in log["losses_every_50_steps"]]
    return line_plot(
        json_path,
        loss_steps(len(losses), int(log["steps"])),
        {"training loss": losses},
        title=(
            f"{log.get('size', 'small')} MoE, {log.get('parameters', '?')} parameters: held-out "
            f"perplexity {log.get('heldout_perplexity', '?')}"
        ),
        xlabel="step",
        ylabel="cross-entropy loss (nats)",
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--steps", type=int, default=480)
    ap.add_argument("--seed", type=int, default=SEED, help="initial weights and crops")
    ap.add_argument("--corpus", choices=CORPORA, default="pydoc", help="training / held-out text")
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    ap.add_argument("--plot-only", action="store_true", help="redraw --out/train_log.png only")
    args = ap.parse_args()
    if args.plot_only:
        png = plot_train_log(args.out / "train_log.json")
        if png is not None:
            print(f"wrote {png}")
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    held_in, held_out = split_topics(args.corpus)
    tok = train_tokenizer(held_in)
    stream = encode_stream(tok, held_in)
    heldout_text = "".join(t + EOT for t in held_out)
    heldout_ids = np.asarray(tok.encode(heldout_text).ids, dtype=np.int64)
    print(
        f"held-in {sum(map(len, held_in))} characters = {len(stream)} tokens, held-out "
        f"{len(heldout_text)} characters = {len(heldout_ids)} tokens"
    )
    model, losses, seconds = train(
        stream, args.steps, args.lr, args.threads, SIZES[args.size], seed=args.seed
    )
    # Round to the stored dtype, so the fp32 model evaluated here is the one written.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(getattr(torch, args.dtype)).to(torch.float32))
    ppl = heldout_perplexity(model, heldout_ids)
    train_ppl = heldout_perplexity(model, stream)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"trained {args.steps} steps in {seconds:.0f} s; held-out perplexity {ppl:.2f}")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model.to(getattr(torch, args.dtype)).save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))
    (out / "heldout.txt").write_text(heldout_text, encoding="utf-8")
    calib = token_windows(stream, CALIB_WINDOWS, CALIB_WINDOW).astype(np.int32)
    np.save(out / "calib.npy", calib)
    for extra in ("generation_config.json",):
        (out / extra).unlink(missing_ok=True)
    log = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "threads": args.threads,
        "size": args.size,
        "corpus": args.corpus,
        "seed": args.seed,
        "steps": args.steps,
        "batch": [BATCH, SEQ],
        "lr": args.lr,
        "dtype": args.dtype,
        "parameters": n_params,
        "train_seconds": round(seconds, 1),
        "held_in_tokens": len(stream),
        "held_out_tokens": len(heldout_ids),
        "losses_every_50_steps": losses,
        "heldout_perplexity": round(ppl, 3),
        "held_in_perplexity": round(train_ppl, 3),
        "eval": f"{EVAL_WINDOWS} windows x {EVAL_WINDOW} tokens",
    }
    (out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    plot_train_log(out / "train_log.json")
    total = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"{n_params} parameters; wrote {out} ({total} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
