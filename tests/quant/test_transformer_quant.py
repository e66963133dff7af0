"""Whole transformers with quantised routed experts: the numpy mirror
(colibri/reference/transformer.py ``quant=``) vs transformers' fp32 model (top-1 agreement of
next-token predictions), and the generated C (``colibri generate CKPT --quant int8``) vs that
mirror on the host and cortex-m7."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.errors import BudgetExceeded, ConfigError
from colibri.frontends.hf_model import load_hf_transformer
from colibri.ir.transformer import MoETransformer
from colibri.quant.formats import QuantExpert
from colibri.quant.model import TransformerQuant, quantize_transformer
from colibri.reference.transformer import KVCache, forward, generate
from colibri.targets.lmrun import run_lm
from colibri.targets.size import size_report
from conftest import ROOT, require_board, run_cli
from hf_tiny import (
    ARCHS,
    MODEL_CASES,
    N_NEW_TOKENS,
    ToyLanguage,
    generate_lm,
    hf_logits,
    init_model,
    make_model,
    render_lm,
    require_torch,
    save_model,
    short_prompt,
    trained_model,
)

#: The issue's target: top-1 agreement of next-token predictions, int8 model vs fp32.
TOP1_TARGET = 0.99
#: Every position of N_PROMPTS seeded prompts of PROMPT_LEN tokens is compared, for each of an
#: architecture's configs in MODEL_CASES (3 x 512 positions per architecture).
N_PROMPTS = 16
PROMPT_LEN = 32
#: The untrained models of the fp32 tests (weights std 0.3, routed experts dominating the
#: residual stream: zeroing them changes ~75 % of the top-1 choices) have iid Gaussian logits,
#: so their top-1 margins are as often tiny as chance makes them, and int8's ~1-2 % logit noise
#: flips 1.6-2.3 % of the choices (measured per architecture: Mixtral 97.72 %, Qwen2-MoE
#: 98.37 %, OLMoE 98.18 %; weight-only int8 98.57 / 99.22 / 98.63 %; fp16 99.93 / 99.80 /
#: 100 %). A stress figure, printed; falling below this floor fails (a kernel or mirror bug
#: moves it by far more than the spread between configs).
UNTRAINED_FLOOR = 0.97
#: Generated C vs the numpy mirror, max |logit diff| (absolute). The quantised matvecs are
#: bit-exact with the mirror; what differs is the fp32 C attention / norms vs the float64
#: reference (<= 4e-6, as for fp32) feeding the int8 row quantiser: measured <= 1.2e-5 on
#: every config. An activation moving across an int8 rounding boundary would change one code
#: (~1e-3 on the logits) and fail this on purpose rather than hide behind a loose bound.
C_MIRROR_TOLERANCE = 1e-4
MAX_CONTEXT = 48


@pytest.fixture(autouse=True)
def _torch() -> None:
    require_torch()


@functools.cache
def _trained(case: int) -> tuple[Any, ToyLanguage, float]:
    """MODEL_CASES[case] trained on its ToyLanguage (hf_tiny.trained_model), once per session."""
    arch, overrides = MODEL_CASES[case]
    return trained_model(arch, 200 + case, **overrides)


def _lang_prompts(case: int, lang: ToyLanguage) -> Any:
    """N_PROMPTS held-out sentences of the model's language (training draws from seed 200+)."""
    return lang.sample(np.random.default_rng(5000 + case), N_PROMPTS, PROMPT_LEN)


def _without_routed_experts(model: MoETransformer) -> MoETransformer:
    """A copy whose routed experts output zero (w2 = 0); shared experts and dense MLPs stay."""
    out = copy.deepcopy(model)
    for layer in out.layers:
        if layer.moe is not None:
            for ex in layer.moe.experts:
                ex.w2 = np.zeros_like(ex.w2)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_int8_top1_agreement_with_transformers(tmp_path: Path, arch: str) -> None:
    """The issue's figure: int8 experts (int8 activations, the --quant int8 default) vs
    transformers' fp32 logits at every position of held-out sentences, for every config of the
    architecture trained on its toy language; weight-only int8 and int4 printed alongside. The
    test also checks the models learnt the language and that their routed experts matter
    (removing them changes top-1 choices), so the agreement is not that of a bigram model."""
    counts = {"int8": 0, "all8": 0, "w8": 0, "int4": 0, "rule": 0, "no_experts": 0}
    total = 0
    for case, (case_arch, _) in enumerate(MODEL_CASES):
        if case_arch != arch:
            continue
        model, lang, loss = _trained(case)
        ours = load_hf_transformer(save_model(model, tmp_path / str(case)))
        quants = {
            "int8": quantize_transformer(ours, "int8"),
            "all8": quantize_transformer(ours, "int8", dense="int8"),
            "w8": quantize_transformer(ours, "int8", act="fp32"),
            "int4": quantize_transformer(ours, "int4"),
        }
        bare = _without_routed_experts(ours)
        seqs = _lang_prompts(case, lang)
        got = dict.fromkeys(counts, 0)
        n = 0
        margins = []
        for seq in seqs:
            prompt = [int(t) for t in seq]
            ref = hf_logits(model, prompt)
            top = ref.argmax(axis=1)
            for name, q in quants.items():
                pred = forward(ours, prompt, quant=q).argmax(axis=1)
                got[name] += int((pred == top).sum())
                if name == "int8":
                    for t in np.nonzero(pred != top)[0]:
                        srt = np.sort(ref[t])
                        margins.append(f"{srt[-1] - srt[-2]:.3f}")
            got["rule"] += int((top[1:] == lang.rule(seq[None, :])[0]).sum())
            got["no_experts"] += int((forward(bare, prompt).argmax(axis=1) != top).sum())
            n += len(prompt)
        rule_n = len(seqs) * (PROMPT_LEN - 1)
        print(
            f"\ntrained {arch} case {case} (loss {loss:.3f}, top-1 = the language's rule at "
            f"{got['rule'] / rule_n:.1%}, removing the routed experts changes "
            f"{got['no_experts'] / n:.1%} of top-1): int8 {got['int8']}/{n} = "
            f"{got['int8'] / n:.2%}, whole model int8 (--dense-quant int8) {got['all8'] / n:.2%}, "
            f"weight-only int8 {got['w8'] / n:.2%}, int4 "
            f"{got['int4'] / n:.2%}; fp32 margins where int8 differs: {' '.join(margins)}"
        )
        assert got["rule"] / rule_n > 0.5, f"{arch} case {case} did not learn its language"
        for key in counts:
            counts[key] += got[key]
        total += n
    rate = counts["int8"] / total
    whole = counts["all8"] / total
    print(
        f"int8 top-1 agreement {arch} (trained): {counts['int8']}/{total} = {rate:.2%} "
        f"(whole model int8 {whole:.2%}, weight-only int8 {counts['w8'] / total:.2%}, int4 "
        f"{counts['int4'] / total:.2%}); routed experts decide "
        f"{counts['no_experts'] / total:.1%} of the top-1 choices"
    )
    assert counts["no_experts"] / total > 0.03, f"{arch}: the routed experts barely matter"
    assert rate >= TOP1_TARGET, f"{arch}: int8 top-1 agreement {rate:.2%} < {TOP1_TARGET:.0%}"
    assert whole >= TOP1_TARGET, f"{arch}: whole-model int8 agreement {whole:.2%}"


def _prompts(case: int, vocab: int) -> list[list[int]]:
    return [
        [int(t) for t in np.random.default_rng(500 + 31 * case + s).integers(0, vocab, PROMPT_LEN)]
        for s in range(N_PROMPTS)
    ]


@pytest.mark.parametrize("arch", ARCHS)
def test_int8_top1_agreement_transformers_init(tmp_path: Path, arch: str) -> None:
    """The issue's figure on the configs left at transformers' own random initialisation
    (init_model: std 0.02) and random prompts: int8 experts >= TOP1_TARGET. These models'
    residual stream is mostly the token embedding, so their routed experts decide few top-1
    choices (printed: 0-5 %), which is why the trained models above carry the real check;
    whole-model int8 (--dense-quant int8) is printed too: here the LM head alone sets the
    near-tie choices, and int8 moves 1-2 % of them."""
    counts = {"int8": 0, "all8": 0, "no_experts": 0}
    total = 0
    for case, (case_arch, overrides) in enumerate(MODEL_CASES):
        if case_arch != arch:
            continue
        model = init_model(arch, 200 + case, **overrides)
        ours = load_hf_transformer(save_model(model, tmp_path / str(case)))
        q8 = quantize_transformer(ours, "int8")
        all8 = quantize_transformer(ours, "int8", dense="int8")
        bare = _without_routed_experts(ours)
        for prompt in _prompts(case, model.config.vocab_size):
            top = hf_logits(model, prompt).argmax(axis=1)
            counts["int8"] += int((forward(ours, prompt, quant=q8).argmax(axis=1) == top).sum())
            counts["all8"] += int((forward(ours, prompt, quant=all8).argmax(axis=1) == top).sum())
            counts["no_experts"] += int((forward(bare, prompt).argmax(axis=1) != top).sum())
            total += len(prompt)
    rate = counts["int8"] / total
    print(
        f"\nint8 top-1 agreement {arch} (transformers' init): {counts['int8']}/{total} = "
        f"{rate:.2%} (whole model int8 {counts['all8'] / total:.2%}); routed experts decide "
        f"{counts['no_experts'] / total:.1%} of the top-1 choices"
    )
    assert rate >= TOP1_TARGET, f"{arch}: int8 top-1 agreement {rate:.2%} < {TOP1_TARGET:.0%}"


@pytest.mark.parametrize("arch", ARCHS)
def test_int8_top1_agreement_untrained_stress(tmp_path: Path, arch: str) -> None:
    """The same figure on the untrained std-0.3 models of the fp32 tests and random prompts:
    near-tie next-token choices, the worst case for any quantiser (see UNTRAINED_FLOOR)."""
    agree = {"int8": 0, "w8": 0}
    total = 0
    for case, (case_arch, overrides) in enumerate(MODEL_CASES):
        if case_arch != arch:
            continue
        model = make_model(arch, seed=200 + case, **overrides)
        ours = load_hf_transformer(save_model(model, tmp_path / str(case)))
        q8 = quantize_transformer(ours, "int8")
        w8 = quantize_transformer(ours, "int8", act="fp32")
        a8 = aw = n = 0
        for prompt in _prompts(case, model.config.vocab_size):
            top = hf_logits(model, prompt).argmax(axis=1)
            a8 += int((forward(ours, prompt, quant=q8).argmax(axis=1) == top).sum())
            aw += int((forward(ours, prompt, quant=w8).argmax(axis=1) == top).sum())
            n += len(prompt)
        print(f"\nuntrained {arch} case {case}: int8 {a8 / n:.2%}, weight-only {aw / n:.2%}")
        agree["int8"] += a8
        agree["w8"] += aw
        total += n
    rate = agree["int8"] / total
    print(
        f"int8 top-1 agreement {arch} (untrained, stress): {agree['int8']}/{total} = {rate:.2%} "
        f"(weight-only int8 {agree['w8'] / total:.2%})"
    )
    assert rate >= UNTRAINED_FLOOR, f"{arch}: int8 top-1 agreement {rate:.2%} collapsed"


@pytest.mark.parametrize("arch", ARCHS)
def test_c_int8_top1_agreement_on_host(tmp_path: Path, arch: str) -> None:
    """End to end: the generated C (--quant int8, host) on held-out sentences of the first
    trained config of the architecture, its prompt logits' top-1 vs transformers'."""
    case = next(i for i, (a, _) in enumerate(MODEL_CASES) if a == arch)
    model, lang, _ = _trained(case)
    ours = load_hf_transformer(save_model(model, tmp_path / "ckpt"))
    gen, _ = generate_lm(ours, tmp_path / "gen", "host", arch, MAX_CONTEXT, quant="int8")
    same = n = 0
    for seq in _lang_prompts(case, lang)[:4]:
        prompt = [int(t) for t in seq]
        out, _ = run_lm(gen, "host", prompt, 1, want_logits=True)
        assert out.logits is not None
        same += int((out.logits.argmax(axis=1) == hf_logits(model, prompt).argmax(axis=1)).sum())
        n += len(prompt)
    print(f"\n{arch}: C int8 on host, top-1 agreement with transformers {same}/{n}")
    assert same / n >= TOP1_TARGET


#: Generated C vs the numpy mirror of the same quantised model, on logits (relative to the
#: largest |logit|). The matvecs are bit-exact (tests/quant/test_quant.py); what differs is libm's
#: expf in SiLU and softmax vs numpy (an ulp), which can move one activation across an int8
#: rounding boundary: one code step of one block. Measured <= 3.5e-7 on these models (every
#: architecture and scheme below); a wrong scale, block or arena offset moved them by > 1e-2.
C_VS_MIRROR_TOLERANCE = 2e-5


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "quant,dense", [("int8", "fp32"), ("int4", "fp32"), ("int8", "int8"), ("int4", "int8")]
)
def test_c_quantised_matches_mirror(tmp_path: Path, arch: str, quant: str, dense: str) -> None:
    """The generated C of a quantised whole model gives the numpy mirror's logits at every
    position (reference.transformer.forward with the same TransformerQuant), the top-1 included
    wherever the mirror's own margin exceeds the tolerance."""
    case = next(i for i, (a, _) in enumerate(MODEL_CASES) if a == arch)
    model, lang, _ = _trained(case)
    ours = load_hf_transformer(save_model(model, tmp_path / "ckpt"))
    gen, _ = generate_lm(
        ours, tmp_path / "gen", "host", arch, MAX_CONTEXT, quant=quant, dense=dense
    )
    q = quantize_transformer(ours, quant, dense=dense)
    worst = 0.0
    for seq in _lang_prompts(case, lang)[:2]:
        prompt = [int(t) for t in seq]
        out, _ = run_lm(gen, "host", prompt, 1, want_logits=True)
        assert out.logits is not None
        ref = forward(ours, prompt, quant=q)
        scale = float(np.abs(ref).max())
        diff = np.abs(out.logits - ref) / scale
        worst = max(worst, float(diff.max()))
        top2 = np.sort(ref, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) / scale > 2 * C_VS_MIRROR_TOLERANCE
        assert np.array_equal(out.logits.argmax(1)[clear], ref.argmax(1)[clear])
    print(f"\n{arch} {quant}/{dense}: C vs mirror, max relative logit difference {worst:.2e}")
    assert worst <= C_VS_MIRROR_TOLERANCE


def test_reference_cli_gives_the_c_logits_and_tokens(tmp_path: Path) -> None:
    """`colibri reference CKPT --prompt-ids --logits --max-new-tokens` with generate's flags
    (here int4 experts, int8 dense, --calib) is what `colibri run` of the generated C prints."""
    case = next(i for i, (a, _) in enumerate(MODEL_CASES) if a == "mixtral")
    model, lang, _ = _trained(case)
    ckpt = save_model(model, tmp_path / "ckpt")
    calib = tmp_path / "calib.npy"
    np.save(calib, lang.sample(np.random.default_rng(77), 8, 24).astype(np.int64))
    prompt = ",".join(str(int(t)) for t in _lang_prompts(case, lang)[0][:12])
    flags = ["--quant", "int4", "--dense-quant", "int8", "--calib", str(calib)]
    flags += ["--max-context", "32"]
    ref = run_cli(
        "reference", str(ckpt), "--prompt-ids", prompt, "--logits", str(tmp_path / "r.npy"),
        "--max-new-tokens", "8", *flags,
    )  # fmt: skip
    run_cli("generate", str(ckpt), "--out", str(tmp_path / "gen"), *flags)
    c = run_cli(
        "run", str(tmp_path / "gen"), "--prompt-ids", prompt, "--logits", str(tmp_path / "c.npy"),
        "--max-new-tokens", "8",
    )  # fmt: skip
    want, got = np.load(tmp_path / "r.npy"), np.load(tmp_path / "c.npy")
    assert want.shape == got.shape == (12, model.config.vocab_size)
    assert np.abs(want - got).max() / np.abs(want).max() <= C_VS_MIRROR_TOLERANCE
    new = ref.stdout.split("generated ids: ")[1].split()[0]
    assert new.replace(",", " ") in c.stdout.replace(",", " "), (new, c.stdout)
    bad = run_cli("reference", str(ckpt), "--prompt-ids", prompt, check=False)
    assert bad.returncode != 0 and "--logits L.npy and/or --max-new-tokens" in bad.stderr


@pytest.mark.parametrize(
    ("board", "quant", "dense"),
    [("host", "int8", "fp32"), ("host", "int4", "fp32"), ("host", "int8", "int8"),
     ("cortex-m7", "int4", "fp32")],
)  # fmt: skip
def test_c_is_the_mirror_bit_for_bit_on_a_trained_model(
    tmp_path: Path, board: str, quant: str, dense: str
) -> None:
    """Issue 14, point 7: on the Mixtral trained on real text (tests/data/trained_moe), the
    generated C and the numpy mirror give the same greedy continuation and the same logits, to
    the bit, at every position: the prompt's and the generated tokens' (the C re-run
    teacher-forced over prompt + continuation)."""
    require_board(board)
    from colibri.frontends.tokenizer import load_tokenizer

    ckpt = ROOT / "tests" / "data" / "trained_moe"
    ours = load_hf_transformer(ckpt)
    text = (ckpt / "heldout.txt").read_text(encoding="utf-8")
    prompt = load_tokenizer(ckpt / "tokenizer.json").encode(text)[500:540]
    n_new = 24
    ctx = len(prompt) + n_new
    gen, _ = generate_lm(ours, tmp_path / "gen", board, "lm", ctx, quant=quant, dense=dense)
    q = quantize_transformer(ours, quant, dense=dense)
    out, _ = run_lm(gen, board, prompt, n_new)
    want = generate(ours, prompt, n_new, quant=q)
    assert out.tokens.tolist() == want[len(prompt) :], "greedy continuations differ"
    full = want[:-1]  # every position whose logits chose a token
    out, _ = run_lm(gen, board, full, 0, want_logits=True)
    assert out.logits is not None
    ref = forward(ours, full, quant=q)
    diff = np.abs(out.logits.astype(np.float64) - ref)
    print(f"\n{board} {quant}/{dense}: {len(full)} positions, max |C - mirror| {diff.max():.3g}")
    assert diff.max() <= C_MIRROR_TOLERANCE
    differ = np.flatnonzero((out.logits != ref.astype(np.float32)).any(axis=1))
    assert differ.size == 0, f"logits not bit-identical at positions {differ.tolist()}"


# -- the numpy mirror --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A Qwen2-MoE with a dense layer and a shared expert."""
    require_torch()
    path = tmp_path_factory.mktemp("qwen") / "ckpt"
    model = make_model("qwen2_moe", seed=7, num_hidden_layers=3, mlp_only_layers=[0])
    return load_hf_transformer(save_model(model, path))


def test_quantize_transformer_structure(qwen: Any) -> None:
    q = quantize_transformer(qwen, "int8")
    assert isinstance(q, TransformerQuant) and (q.scheme, q.act) == ("int8", "int8")
    assert sorted(q.experts) == [1, 2]  # layer 0 is dense: stays fp32
    for i, experts in q.experts.items():
        moe = qwen.layers[i].moe
        assert sorted(experts) == sorted(set(moe.storage_map()))
        qe = experts[0]
        assert isinstance(qe, QuantExpert) and qe.w1.scheme == "int8"
        assert qe.w1.data.dtype == np.int8 and qe.w1.data.shape == (moe.config.d_ff, 16)
        assert moe.shared_expert is not None and moe.shared_expert.w1.dtype == np.float32
    assert quantize_transformer(qwen, "int4", act="fp32").act == "fp32"
    assert quantize_transformer(qwen, "fp16").act == "fp32"  # no integer fp16 kernel
    with pytest.raises(ConfigError, match="unknown scheme 'int3'"):
        quantize_transformer(qwen, "int3")


def test_quant_forward_cache_and_generate(qwen: Any) -> None:
    ids = [1, 9, 4, 33, 2, 8, 60, 5]
    q = quantize_transformer(qwen, "int8")
    full = forward(qwen, ids, quant=q)
    assert np.array_equal(forward(qwen, ids, quant="int8"), full)  # by name: same weights
    assert np.array_equal(forward(qwen, ids, quant="fp32"), forward(qwen, ids))
    assert 1e-4 < np.max(np.abs(full - forward(qwen, ids))) < 0.5  # quantised, not broken
    cache = KVCache()
    parts = [forward(qwen, ids[:3], cache, q)] + [forward(qwen, [t], cache, q) for t in ids[3:]]
    # One token at a time quantises the same rows as one pass (per-token activation scales).
    assert np.max(np.abs(np.concatenate(parts) - full)) < 1e-12
    out = generate(qwen, ids[:3], 6, quant=q)
    step = list(ids[:3])
    for _ in range(6):
        step.append(int(np.argmax(forward(qwen, step, quant=q)[-1])))
    assert out == step


# -- generated C vs the mirror -----------------------------------------------------------------


def _check_c(
    gen: Path, board: str, ours: Any, q: TransformerQuant, prompt: list[int], what: str
) -> list[int]:
    out, _ = run_lm(gen, board, prompt, N_NEW_TOKENS, want_logits=True)
    assert out.logits is not None
    ref = forward(ours, prompt, quant=q)
    diff = np.abs(out.logits.astype(np.float64) - ref)
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    print(f"\n{what}: max |C - mirror| logit {diff.max():.3g}")
    assert diff.max() <= C_MIRROR_TOLERANCE, (
        f"{what}: max |logit diff| {diff.max():.3g} > {C_MIRROR_TOLERANCE} at {worst}: C "
        f"{out.logits[worst]!r}, mirror {ref[worst]!r}"
    )
    want = generate(ours, prompt, N_NEW_TOKENS, quant=q)[len(prompt) :]
    got = out.tokens.tolist()
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert got == want, (
        f"{what}: greedy ids differ from index {first}:\n  C: {got}\n  mirror: {want}"
    )
    return got


def _prompt(case: int, vocab: int) -> list[int]:
    return short_prompt(300 + case, vocab)


@pytest.mark.parametrize("case", range(len(MODEL_CASES)))
def test_c_int8_matches_mirror_on_host(tmp_path: Path, case: int) -> None:
    arch, overrides = MODEL_CASES[case]
    model = make_model(arch, seed=200 + case, **overrides)
    ours = load_hf_transformer(save_model(model, tmp_path / "ckpt"))
    gen, manifest = generate_lm(ours, tmp_path / "gen", "host", "lm", MAX_CONTEXT, quant="int8")
    qr = manifest["quantization"]
    assert (qr["scheme"], qr["act"]) == ("int8", "int8")
    assert qr["weight_bytes"] == manifest["memory"]["weight_bytes"] < qr["fp32_weight_bytes"]
    prompt = _prompt(case, model.config.vocab_size)
    _check_c(gen, "host", ours, quantize_transformer(ours, "int8"), prompt, f"{arch} case {case}")


@pytest.mark.parametrize(("scheme", "act"), [("int4", None), ("int8", "fp32"), ("fp16", None)])
def test_c_other_schemes_match_mirror_on_host(tmp_path: Path, scheme: str, act: str | None) -> None:
    model = make_model("qwen2_moe", seed=203)
    ours = load_hf_transformer(save_model(model, tmp_path / "ckpt"))
    gen, manifest = generate_lm(
        ours, tmp_path / "gen", "host", "lm", MAX_CONTEXT, quant=scheme, act=act
    )
    q = quantize_transformer(ours, scheme, act)
    assert manifest["options"]["act"] == q.act
    _check_c(gen, "host", ours, q, [3, 14, 15, 9, 26, 5], f"qwen2_moe {scheme}/{q.act}")


@pytest.fixture(scope="module")
def arch_ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    require_torch()
    return {
        arch: save_model(make_model(arch, seed=10 + i), tmp_path_factory.mktemp(arch) / "ckpt")
        for i, arch in enumerate(ARCHS)
    }


@pytest.mark.parametrize("arch", ARCHS)
def test_c_int8_on_cortex_m7(tmp_path: Path, arch: str, arch_ckpts: dict[str, Path]) -> None:
    require_board("cortex-m7")
    ours = load_hf_transformer(arch_ckpts[arch])
    q = quantize_transformer(ours, "int8")
    prompt = [3, 14, 15, 9, 26, 5]
    gen, _ = generate_lm(ours, tmp_path / "m7", "cortex-m7", arch, MAX_CONTEXT, quant="int8")
    board_ids = _check_c(gen, "cortex-m7", ours, q, prompt, f"{arch} int8 on cortex-m7")
    host, _ = generate_lm(ours, tmp_path / "h", "host", arch, MAX_CONTEXT, quant="int8")
    assert run_lm(host, "host", prompt, N_NEW_TOKENS)[0].tokens.tolist() == board_ids
    if arch == "mixtral":  # the linked firmware shrinks by what the manifest says it saves
        fp32, _ = generate_lm(ours, tmp_path / "f", "cortex-m7", arch, MAX_CONTEXT)
        small, big = size_report(gen, "cortex-m7"), size_report(fp32, "cortex-m7")
        saved = big.flash_used - small.flash_used
        manifest_saved = render_lm(ours, "cortex-m7", arch, MAX_CONTEXT, "int8")[1]
        expected = manifest_saved["quantization"]["bytes_saved"]
        assert 0.9 * expected < saved < 1.1 * expected
        # RAM barely moves: + the act_q row, - the fp32 expert pointer tables (.data). The
        # stack and its guard are sized by the deepest path and largest frames
        # (colibri/targets/stack.py): the int8 experts' r4p kernels (w2's 24 inputs padded to
        # 32) keep activation pairs on the stack, so the stack is compared apart.
        assert abs(_ram_but_stack(small) - _ram_but_stack(big)) < 1024


# -- generation options, budget, CLI -----------------------------------------------------------


def test_fp32_output_has_no_quantisation(arch_ckpts: dict[str, Path]) -> None:
    ours = load_hf_transformer(arch_ckpts["mixtral"])
    files, manifest = render_lm(ours, "host", "lm", 16)
    assert "quantization" not in manifest and "quant" not in manifest["options"]
    assert "act_q" not in [r["name"] for r in manifest["memory"]["regions"]]
    assert "colibri_quant.h" not in files["transformer_weights.h"]
    files, manifest = render_lm(ours, "host", "lm", 16, "int8")
    regions = {r["name"]: r for r in manifest["memory"]["regions"]}
    assert regions["act_q"]["size"] == 4 + 24  # one block scale, max(d_model 16, d_ff 24) codes
    assert "_Static_assert(sizeof(lm_q8_24x16_t)" in files["transformer_weights.h"]
    assert "colibri_matvec_q8_q8" in files["transformer_model.c"]
    _, w8 = render_lm(ours, "host", "lm", 16, "int8", "fp32")
    assert "act_q" not in [r["name"] for r in w8["memory"]["regions"]]
    with pytest.raises(ConfigError, match="--act applies to int8/int4 matrices"):
        render_lm(ours, "host", "lm", 16, "fp32", "int8")


def test_budget_counts_quantised_weights(tmp_path: Path) -> None:
    """A model whose fp32 experts overflow the cortex-m3's 256 KB of flash fits as int8."""
    model = make_model(
        "mixtral", seed=1, num_hidden_layers=1, hidden_size=32, intermediate_size=160,
        num_local_experts=8,
    )  # fmt: skip
    ours = load_hf_transformer(save_model(model, tmp_path / "ckpt"))
    with pytest.raises(BudgetExceeded, match=r"(?s)flash: .*fit the flash: .*--quant int8"):
        generate_lm(ours, tmp_path / "f", "cortex-m3", "lm", 16)
    assert not (tmp_path / "f").exists()
    _, manifest = generate_lm(ours, tmp_path / "q", "cortex-m3", "lm", 16, quant="int8")
    assert manifest["memory"]["weight_bytes"] < 256 * 1024 - 24 * 1024


def test_cli_generate_quant(arch_ckpts: dict[str, Path], tmp_path: Path) -> None:
    ckpt = arch_ckpts["olmoe"]
    gen = tmp_path / "cli"
    proc = run_cli(
        "generate", str(ckpt), "--out", str(gen), "--max-context", "24", "--quant", "int8"
    )
    assert "routed experts int8 (int8 activations): weights" in proc.stdout
    ours = load_hf_transformer(ckpt)
    out, _ = run_lm(gen, "host", [1, 5, 9], 8)
    want = generate(ours, [1, 5, 9], 8, quant="int8")[3:]
    assert out.tokens.tolist() == want
    for extra in (["--cache", "lru"], ["--expert-quant", "1=int4"]):
        bad = run_cli("generate", str(ckpt), "--out", str(tmp_path / "x"), *extra, check=False)
        assert bad.returncode == 1 and "single MoE layer options (pass --layer N)" in bad.stderr


# -- --dense-quant: every other matrix quantised too -------------------------------------------


def test_quantize_transformer_dense_structure(qwen: Any) -> None:
    q = quantize_transformer(qwen, "int4", dense="int8")
    assert (q.scheme, q.act, q.dense_scheme, q.dense_act) == ("int4", "int8", "int8", "int8")
    c = qwen.config
    assert q.dense["embed"].data.shape == (c.vocab_size, c.d_model)
    assert q.lm_head() is q.dense["lm_head"]  # untied
    hq = c.n_heads * c.head_dim
    for i in range(c.n_layers):
        assert q.dense[f"l{i}.wq"].data.shape == (hq, c.d_model)
        assert q.dense[f"l{i}.wo"].data.shape == (c.d_model, hq)
    # layer 0 is a dense MLP, layers 1-2 have a shared expert: all three quantised
    assert sorted(q.dense_ffn) == [0, 1, 2]
    assert q.dense_ffn[0].w1.n_out == qwen.layers[0].mlp.w1.shape[1]
    assert quantize_transformer(qwen, "int8", "fp32", dense="fp16").dense_act == "fp32"
    assert quantize_transformer(qwen, "fp32", dense="int8").experts[1][0].scheme == "fp32"
    q4 = quantize_transformer(qwen, "int4", dense="int4")
    assert (q4.dense_scheme, q4.dense_act, q4.dense["embed"].scheme) == ("int4", "int8", "int4")
    assert q4.dense_ffn[0].w1.scheme == "int4"
    with pytest.raises(ConfigError, match=r"--act fp32 with --dense-quant q4k.*int8-activation"):
        quantize_transformer(qwen, "int8", "fp32", dense="q4k")


def test_dense_quant_mirror(qwen: Any) -> None:
    ids = [1, 9, 4, 33, 2, 8, 60, 5]
    ref = forward(qwen, ids)
    experts = forward(qwen, ids, quant=quantize_transformer(qwen, "int8"))
    whole = forward(qwen, ids, quant=quantize_transformer(qwen, "int8", dense="int8"))
    fp16 = forward(qwen, ids, quant=quantize_transformer(qwen, "fp32", dense="fp16"))
    e, w, h = (float(np.max(np.abs(v - ref))) for v in (experts, whole, fp16))
    # quantising more matrices adds error; fp16 everywhere stays far below int8 experts
    assert 0 < h < e < w < 0.5 * float(np.max(np.abs(ref)))
    q = quantize_transformer(qwen, "int8", dense="int8")
    cache = KVCache()
    parts = [forward(qwen, ids[:5], cache, q)] + [forward(qwen, [t], cache, q) for t in ids[5:]]
    assert np.max(np.abs(np.concatenate(parts) - whole)) < 1e-12


DENSE_CASES = [  # (MODEL_CASES index, --quant, --act, --dense-quant)
    (4, "int8", None, "int8"),  # Qwen: dense MLP layer, shared experts, GQA
    (7, "int8", "fp32", "int8"),  # OLMoE: attention biases, QK-norm, clip_qkv
    (2, "fp32", None, "fp16"),  # Mixtral: tied embedding, sliding window
    (8, "int4", None, "int8"),  # OLMoE: tied, MQA, k 1
    # 4- / 5-bit dense matrices (issue 41 item 5): int4 embedding rows, q4k / q5k ones
    (4, "int4", None, "int4"),
    (7, "int4", "fp32", "int4"),  # int4 dense by fp32 activations
    (8, "int4", None, "q4k"),
    (2, "q5k", None, "q5k"),
]


@pytest.mark.parametrize(("case", "quant", "act", "dense"), DENSE_CASES)
def test_c_dense_quant_matches_mirror_on_host(
    tmp_path: Path, case: int, quant: str, act: str | None, dense: str
) -> None:
    arch, overrides = MODEL_CASES[case]
    model = make_model(arch, seed=200 + case, **overrides)
    ours = load_hf_transformer(save_model(model, tmp_path / "ckpt"))
    gen, manifest = generate_lm(
        ours, tmp_path / "gen", "host", "lm", MAX_CONTEXT, quant=quant, act=act, dense=dense
    )
    q = quantize_transformer(ours, quant, act, dense)
    qr = manifest["quantization"]
    assert (qr["dense_scheme"], qr["dense_act"]) == (dense, q.dense_act)
    assert manifest["options"]["dense_quant"] == dense
    _, experts_only = render_lm(ours, "host", "lm", MAX_CONTEXT, quant, act)
    assert qr["weight_bytes"] < experts_only["memory"]["weight_bytes"]
    if q.dense_act == "int8":
        regions = {r["name"]: r["size"] for r in manifest["memory"]["regions"]}
        c = ours.config
        assert regions["act_q"] >= max(c.d_model, c.n_heads * c.head_dim)
    what = f"{arch} case {case} --quant {quant} --act {q.act} --dense-quant {dense}"
    _check_c(gen, "host", ours, q, _prompt(case, model.config.vocab_size), what)


def test_c_dense_quant_on_cortex_m7(tmp_path: Path, arch_ckpts: dict[str, Path]) -> None:
    """Whole-model int8 Qwen2-MoE on the board: mirror-exact, and the firmware shrinks by what
    the manifest says --dense-quant saves over int8 experts alone."""
    require_board("cortex-m7")
    ours = load_hf_transformer(arch_ckpts["qwen2_moe"])
    q = quantize_transformer(ours, "int8", dense="int8")
    gen, man = generate_lm(
        ours, tmp_path / "all", "cortex-m7", "lm", MAX_CONTEXT, quant="int8", dense="int8"
    )
    _check_c(gen, "cortex-m7", ours, q, [3, 14, 15, 9, 26, 5], "qwen2_moe whole int8 on m7")
    experts, man_e = generate_lm(
        ours, tmp_path / "experts", "cortex-m7", "lm", MAX_CONTEXT, quant="int8"
    )
    # the weights (all but the code: the int8 dense FFN runs its own kernel kind, layout r4p
    # with its 20 hidden inputs padded to 32, whose code the fp32 one did not need)
    saved = _flash_but_code(size_report(experts, "cortex-m7")) - _flash_but_code(
        size_report(gen, "cortex-m7")
    )
    expected = man_e["memory"]["weight_bytes"] - man["memory"]["weight_bytes"]
    print(f"\n--dense-quant int8 saves {saved} bytes of flash (manifest: {expected})")
    assert 0.9 * expected < saved < 1.1 * expected


@pytest.mark.parametrize("board", ["cortex-m4", "cortex-m55"])
def test_c_dense_int4_on_mcus(tmp_path: Path, board: str, arch_ckpts: dict[str, Path]) -> None:
    """--quant int4 --dense-quant int4 (Qwen2-MoE: a dense MLP layer, shared experts, untied
    LM head) on the boards whose int4 kernels differ: the mirror's logits to the bit."""
    require_board(board)
    ours = load_hf_transformer(arch_ckpts["qwen2_moe"])
    q = quantize_transformer(ours, "int4", dense="int4")
    gen, man = generate_lm(
        ours, tmp_path / "g", board, "lm", MAX_CONTEXT, quant="int4", dense="int4"
    )
    assert man["quantization"]["dense_scheme"] == "int4"
    _check_c(gen, board, ours, q, [3, 14, 15, 9, 26, 5], f"qwen2_moe int4 + dense int4 on {board}")


@pytest.mark.parametrize("scheme", ["q4k", "q5k"])
def test_c_dense_kquant_on_cortex_m4(
    tmp_path: Path, scheme: str, arch_ckpts: dict[str, Path]
) -> None:
    """--quant / --dense-quant q4k and q5k (Qwen2-MoE) on a bare-metal board: every matrix a
    stream of super-blocks across its rows (the generated mat_rows, the embedding rows
    dequantised from the middle of a super-block), the mirror's logits to the bit."""
    require_board("cortex-m4")
    ours = load_hf_transformer(arch_ckpts["qwen2_moe"])
    q = quantize_transformer(ours, scheme, dense=scheme)
    gen, man = generate_lm(
        ours, tmp_path / "g", "cortex-m4", "lm", MAX_CONTEXT, quant=scheme, dense=scheme
    )
    assert man["quantization"]["dense_scheme"] == scheme
    what = f"qwen2_moe {scheme} + dense {scheme} on cortex-m4"
    _check_c(gen, "cortex-m4", ours, q, [3, 14, 15, 9, 26, 5], what)


def _flash_but_code(rep: Any) -> int:
    """Flash bytes of a size report but its code (.text)."""
    return int(rep.flash_used) - sum(s["size"] for s in rep.sections if s["name"] == ".text")


def _ram_but_stack(rep: Any) -> int:
    """RAM bytes of a size report but the stack region (stack, its guard: .stack)."""
    return int(rep.ram_used) - sum(s["size"] for s in rep.sections if s["name"] == ".stack")


def test_budget_hint_names_dense_quant(tmp_path: Path) -> None:
    """A model whose embedding and LM head alone overflow the cortex-m3's flash: quantising
    the routed experts cannot help; the hint names --dense-quant int8, and it fits."""
    model = make_model("mixtral", seed=3, num_hidden_layers=1, hidden_size=32, vocab_size=1200)
    ours = load_hf_transformer(save_model(model, tmp_path / "ckpt"))
    with pytest.raises(BudgetExceeded) as exc:
        generate_lm(ours, tmp_path / "f", "cortex-m3", "lm", 16)
    msg = str(exc.value)
    assert "largest consumers: embedding 153600 bytes, LM head 153600 bytes" in msg
    # only the flash overflowed: no --max-context / --max-tokens advice (they shrink RAM)
    assert "max-context" not in msg and "--max-tokens" not in msg and "--dense-quant" in msg
    assert "fit the flash: --quant fp16 --dense-quant int8 (~" in msg
    assert not (tmp_path / "f").exists()
    with pytest.raises(BudgetExceeded):
        generate_lm(ours, tmp_path / "e", "cortex-m3", "lm", 16, quant="int4")
    _, man = generate_lm(ours, tmp_path / "q", "cortex-m3", "lm", 16, quant="int8", dense="int8")
    assert man["memory"]["weight_bytes"] < 256 * 1024 - 24 * 1024


def test_cli_dense_quant(arch_ckpts: dict[str, Path], tmp_path: Path) -> None:
    ckpt = arch_ckpts["qwen2_moe"]
    gen = tmp_path / "cli"
    proc = run_cli(
        "generate", str(ckpt), "--out", str(gen), "--max-context", "24", "--quant", "int8",
        "--dense-quant", "int8",
    )  # fmt: skip
    assert "embedding / LM head int8 (int8 activations): weights" in proc.stdout
    ours = load_hf_transformer(ckpt)
    out, _ = run_lm(gen, "host", [1, 5, 9], 8)
    want = generate(ours, [1, 5, 9], 8, quant=quantize_transformer(ours, "int8", dense="int8"))
    assert out.tokens.tolist() == want[3:]
    bad = run_cli(
        "generate", str(ckpt), "--layer", "0", "--out", str(tmp_path / "x"), "--dense-quant",
        "int8", check=False,
    )  # fmt: skip
    assert bad.returncode == 1 and "--dense-quant applies to whole transformers" in bad.stderr
    bad = run_cli(
        "generate", str(ckpt), "--out", str(tmp_path / "y"), "--dense-quant", "fp16", "--act",
        "int8", check=False,
    )  # fmt: skip
    assert bad.returncode == 1 and "--act applies to int8/int4 matrices" in bad.stderr


ROUTER_CASES = [  # (MODEL_CASES index, --quant, --router-quant)
    (4, "int8", "int8"),  # Qwen: shared experts, a dense layer
    (7, "fp32", "fp16"),  # OLMoE, k 4 of 8: fp32 experts, fp16 routers
    (0, "int4", "int8"),
]


@pytest.mark.parametrize(("case", "quant", "router"), ROUTER_CASES)
def test_c_router_quant_matches_mirror_on_host(
    tmp_path: Path, case: int, quant: str, router: str
) -> None:
    """--router-quant on a whole transformer: every MoE layer's router stored in that scheme
    (smaller weights), the C routing and logits equal to the mirror's."""
    arch, overrides = MODEL_CASES[case]
    model = make_model(arch, seed=200 + case, **overrides)
    ours = load_hf_transformer(save_model(model, tmp_path / "ckpt"))
    gen, manifest = generate_lm(
        ours, tmp_path / "gen", "host", "lm", MAX_CONTEXT, quant=quant, router=router
    )
    assert manifest["options"]["router_quant"] == router
    assert manifest["quantization"]["router_scheme"] == router
    _, fp32_router = render_lm(ours, "host", "lm", MAX_CONTEXT, quant)
    assert manifest["memory"]["weight_bytes"] < fp32_router["memory"]["weight_bytes"]
    q = quantize_transformer(ours, quant, router=router)
    assert sorted(q.routers) == [i for i, layer in enumerate(ours.layers) if layer.moe]
    what = f"{arch} case {case} --quant {quant} --router-quant {router}"
    _check_c(gen, "host", ours, q, _prompt(case, model.config.vocab_size), what)


def test_cli_router_quant(arch_ckpts: dict[str, Path], tmp_path: Path) -> None:
    ckpt = arch_ckpts["mixtral"]
    proc = run_cli(
        "generate", str(ckpt), "--out", str(tmp_path / "g"), "--max-context", "24",
        "--router-quant", "int8",
    )  # fmt: skip
    assert "routers int8" in proc.stdout
    ours = load_hf_transformer(ckpt)
    out, _ = run_lm(tmp_path / "g", "host", [1, 5, 9], 8)
    want = generate(ours, [1, 5, 9], 8, quant=quantize_transformer(ours, "fp32", router="int8"))
    assert out.tokens.tolist() == want[3:]
    with pytest.raises(ConfigError, match="--router-quant: unknown scheme 'int4'"):
        quantize_transformer(ours, "int8", router="int4")


#: Shapes that pack (colibri_pack_matrices: n_out >= 16, n_in a multiple of 32), the tiny
#: defaults do not: d_model 64, experts' and the shared expert's d_ff multiples of 32.
PACKABLE = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 32,
}


@pytest.mark.parametrize(
    "arch,quant,dense",
    [("qwen2_moe", "int8", "int8"), ("qwen2_moe", "int4", "int8"), ("mixtral", "int4", "fp32")],
)
def test_c_host_packed_matches_plain_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: str, quant: str, dense: str
) -> None:
    """On the host the generated model packs its int8 / int4 matrices at setup for the CPU's
    packed kernels (AVX-512 VNNI); its logits are those of the plain kernels to the bit
    (COLIBRI_LM_PACK=0 turns packing off), and the manifest states the packed block's bytes."""
    overrides = {k: v for k, v in PACKABLE.items() if arch == "qwen2_moe" or "moe" not in k}
    model = make_model(arch, seed=41, **overrides)
    ours = load_hf_transformer(save_model(model, tmp_path / "ckpt"))
    gen, manifest = generate_lm(
        ours, tmp_path / "gen", "host", "lm", MAX_CONTEXT, quant=quant, dense=dense
    )
    assert manifest["memory"]["packed_bytes_max"] > 0
    assert "colibri_pack_matrices" in (gen / "transformer_model.c").read_text()
    prompt = _prompt(0, model.config.vocab_size)
    packed, _ = run_lm(gen, "host", prompt, 4, want_logits=True)
    monkeypatch.setenv("COLIBRI_LM_PACK", "0")
    plain, _ = run_lm(gen, "host", prompt, 4, want_logits=True)
    assert packed.logits is not None and plain.logits is not None
    assert np.array_equal(packed.logits.view(np.uint32), plain.logits.view(np.uint32))
    assert packed.tokens.tolist() == plain.tokens.tolist()
    if quant == "int8":
        # setup without memory for the packed block: the plain kernels run, same bits
        monkeypatch.setenv("COLIBRI_LM_PACK", "1")
        monkeypatch.setenv("LD_PRELOAD", str(_no_huge_alloc(tmp_path)))
        mark = tmp_path / "refused"
        monkeypatch.setenv("NO_HUGE_ALLOC_MARK", str(mark))
        starved, _ = run_lm(gen, "host", prompt, 4, want_logits=True)
        assert mark.is_file(), "the packed block was not asked for"
        assert starved.logits is not None
        assert np.array_equal(starved.logits.view(np.uint32), plain.logits.view(np.uint32))


def _no_huge_alloc(where: Path) -> Path:
    """A preload library whose aligned_alloc fails for huge-page alignment (the packed block's),
    as on a machine without the memory: every other allocation is the C library's."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no host C compiler for the preload library")
    src = where / "no_huge_alloc.c"
    src.write_text(
        "#define _GNU_SOURCE\n#include <dlfcn.h>\n#include <stdio.h>\n#include <stdlib.h>\n"
        "void *aligned_alloc(size_t a, size_t n) {\n"
        "    void *(*real)(size_t, size_t) = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "
        '"aligned_alloc");\n'
        "    if (a < ((size_t)2 << 20)) return real(a, n);\n"
        '    const char *mark = getenv("NO_HUGE_ALLOC_MARK");\n'
        '    FILE *f = mark ? fopen(mark, "w") : NULL;\n'
        "    if (f) fclose(f);\n"
        "    return NULL;\n}\n"
    )
    lib = where / "no_huge_alloc.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src), "-ldl"], check=True)
    return lib
