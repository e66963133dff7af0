"""Calibration statistics (issue 15, point 3): what each expert sees of the calibration data.

The fp32 reference runs over the calibration input — a whole transformer's forward
(:func:`colibri.reference.transformer.forward`, captured at every MoE block's input) over token
ids, or a lone MoE layer's own input rows — and every token is routed by the layer's fp32 router
(the C-identical one). Each stored expert then accumulates, over the tokens routed to it only:
hits, E[x^2] of its input (d_model), E[h^2] and E[|h|] of its hidden activation h =
act(w1 x + b1) (* w3 x when gated; d_ff), the second moments of both within groups of
colibri.quant.gptq.GROUP channels (what the block-local error compensation reads), and a
deterministic sample of up to MAX_EXPERT_ROWS of those inputs with the fp32 expert's float64
output on them (and the group moments of the sample, and with --calib-method gptq its hidden
activations). The result is the plain arrays of
:class:`colibri.quant.calib.LayerCalib`, which the quantisation stage uses.

:func:`expert_heat` turns the hits into the per-layer heat a whole-model file stores.

:func:`load_calib_ids` reads the token ids of `colibri generate CKPT --calib`: an integer .npy
(1-D, or [N, T] for N sequences) or a text file tokenized with the checkpoint's tokenizer.json
(one token per UTF-8 byte without one, as `colibri run --prompt`); each sequence is cut into
pieces of at most max_len tokens (the generated model's --max-context).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import ConfigError, InputError
from ..frontends.load import load_npy
from ..frontends.tokenizer import load_tokenizer
from ..ir.moe import MoELayer
from ..ir.transformer import DecoderLayer, MoETransformer
from ..progress import Stage, Tick
from ..quant.calib import ExpertCalib, ExpertRunner, LayerCalib
from ..quant.formats import QuantExpert
from ..quant.gptq import block_moments, block_moments_shape
from .kernels import quant_expert_ffn
from .moe import ffn, hidden, route
from .transformer import KVCache, forward, layer_forward

#: Inputs kept per expert for choosing and reporting its calibrated weights (a deterministic
#: sample spread over the calibration data).
MAX_EXPERT_ROWS = 512
#: Inputs kept per MoE layer for its accuracy report.
MAX_LAYER_ROWS = 1024


class _Sample:
    """A deterministic, evenly spread sample of at most `limit` rows of a stream: row n is kept
    while n is a multiple of the stride, and the stride doubles (every other kept row dropped)
    whenever 2 * limit rows are kept."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.stride = 1
        self.seen = 0
        self.rows: list[np.ndarray] = []
        self.count = 0

    def add(self, x: np.ndarray) -> None:
        idx = np.arange(self.seen, self.seen + x.shape[0])
        self.seen += x.shape[0]
        keep = x[idx % self.stride == 0]
        if keep.shape[0]:
            self.rows.append(keep)
            self.count += keep.shape[0]
        while self.count >= 2 * self.limit:
            allr = np.concatenate(self.rows)[::2]
            self.rows, self.count, self.stride = [allr], allr.shape[0], self.stride * 2

    def array(self, width: int) -> np.ndarray:
        if not self.rows:
            return np.zeros((0, width), np.float32)
        allr = np.concatenate(self.rows)
        if allr.shape[0] > self.limit:
            allr = allr[np.linspace(0, allr.shape[0] - 1, self.limit).round().astype(np.int64)]
        return np.ascontiguousarray(allr, dtype=np.float32)


def expert_runner(layer: MoELayer) -> ExpertRunner:
    """The layer's quantised experts as the generated C computes them (the kernels' mirror)."""
    c = layer.config

    def run(qe: QuantExpert, x: np.ndarray) -> np.ndarray:
        return quant_expert_ffn(qe, c.activation, c.gated, x)

    return run


class _LayerStats:
    """Running sums of one MoE layer's calibration statistics, per stored expert."""

    def __init__(self, layer: MoELayer) -> None:
        c = layer.config
        self.layer = layer
        self.storage = layer.storage_map()
        self.tokens = 0
        self.hits = np.zeros(c.n_experts, np.int64)
        self.x2 = np.zeros((c.n_experts, c.d_model))
        self.h2 = np.zeros((c.n_experts, c.d_ff))
        self.habs = np.zeros((c.n_experts, c.d_ff))
        self.samples = [_Sample(MAX_EXPERT_ROWS) for _ in range(c.n_experts)]
        self.inputs = _Sample(MAX_LAYER_ROWS)
        self.xblk = np.zeros((c.n_experts, *block_moments_shape(c.d_model)))
        self.hblk = np.zeros((c.n_experts, *block_moments_shape(c.d_ff)))

    @property
    def n_stored(self) -> int:
        return len(set(self.storage))

    def add(self, x: np.ndarray, tick: Tick | None = None) -> None:
        """Add a batch of the layer's input rows; `tick(k, n)` after each of the n experts the
        batch reaches."""
        x = np.asarray(x, dtype=np.float32)
        self.tokens += x.shape[0]
        self.inputs.add(x)
        r = route(self.layer, x)
        owners = np.asarray(self.storage)[r.expert_ids]
        chosen = np.unique(owners)
        for k, e in enumerate(chosen):
            if tick is not None:
                tick(k + 1, chosen.size)
            rows = np.nonzero(np.any(owners == e, axis=1))[0]
            xe = x[rows]
            h = hidden(self.layer.experts[int(e)], self.layer, xe)
            self.hits[e] += rows.size
            self.x2[e] += np.sum(xe.astype(np.float64) ** 2, axis=0)
            self.h2[e] += np.sum(h**2, axis=0)
            self.habs[e] += np.sum(np.abs(h), axis=0)
            self.xblk[e] += block_moments(xe)
            self.hblk[e] += block_moments(h)
            self.samples[e].add(xe)

    def result(self, tick: Tick | None = None, hidden_rows: bool = False) -> LayerCalib:
        """The statistics; `tick(k, n)` after each of the n stored experts; `hidden_rows`:
        keep each expert's hidden activations on its sample rows (--calib-method gptq)."""
        layer, c = self.layer, self.layer.config
        experts: dict[int, ExpertCalib] = {}
        stored = sorted(set(self.storage))
        for k, e in enumerate(stored):
            if tick is not None:
                tick(k + 1, len(stored))
            n = int(self.hits[e])
            rows = self.samples[e].array(c.d_model)
            target = ffn(layer.experts[e], layer, rows) if n else np.zeros((0, c.d_model))
            hrows = hidden(layer.experts[e], layer, rows) if n else np.zeros((0, c.d_ff))
            ns = max(rows.shape[0], 1)
            sample_blk = (block_moments(rows) / ns, block_moments(hrows) / ns)
            div = max(n, 1)
            experts[e] = ExpertCalib(
                n,
                self.x2[e] / div,
                self.h2[e] / div,
                self.habs[e] / div,
                rows,
                target,
                hrows if hidden_rows else None,
                self.xblk[e] / div,
                self.hblk[e] / div,
                *sample_blk,
            )
        return LayerCalib(self.tokens, experts, expert_runner(layer), self.inputs.array(c.d_model))


def layer_calibration(
    layer: MoELayer, x: np.ndarray, stage: Stage | None = None, hidden_rows: bool = True
) -> LayerCalib:
    """Calibration statistics of a lone MoE layer from its input rows x [T, d_model].
    `stage` (a colibri.progress line) counts the experts: the batch's statistics of each
    expert it reaches, then each stored expert's sample outputs. `hidden_rows`: keep the
    hidden activations of the sample rows (what --calib-method gptq needs)."""
    stats = _LayerStats(layer)
    n = stats.n_stored
    if stage is not None:
        stage.total = 2 * n

    def tick(part: int, label: str) -> Tick:
        def update(k: int, total: int) -> None:
            if stage is not None:
                stage.update(part * n + k * n / max(total, 1), f"{label}  expert {k}/{total}")

        return update

    stats.add(x, tick(0, f"{x.shape[0]} tokens"))
    return stats.result(tick(1, "statistics"), hidden_rows)


def transformer_calibration(
    model: MoETransformer,
    sequences: list[np.ndarray],
    stage: Stage | None = None,
    hidden_rows: bool = True,
) -> dict[int, LayerCalib]:
    """Calibration statistics of every MoE layer (by layer index) from the fp32 reference
    forward over each token-id sequence (a fresh KV cache each). `stage` (a colibri.progress
    line) counts each sequence's pass through each MoE layer, then each stored expert's
    statistics: ``calibrate  batch 3/8  layer 2/4  expert 5/8``. `hidden_rows`: keep each
    expert's hidden activations on its sample rows (what --calib-method gptq needs)."""
    stats = {i: _LayerStats(layer.moe) for i, layer in enumerate(model.layers) if layer.moe}
    counter = _Counter(stage, stats, len(sequences))
    for seq in sequences:
        counter.batch += 1
        forward(model, seq, capture=counter.capture, logits=False)
    out: dict[int, LayerCalib] = {}
    for i, s in stats.items():
        counter.layer = i
        out[i] = s.result(counter.tick_result, hidden_rows)
        counter.done += s.n_stored
    return out


class _Counter:
    """The progress of :func:`transformer_calibration`: a unit per sequence and MoE layer,
    then one per stored expert's statistics."""

    def __init__(self, stage: Stage | None, stats: dict[int, _LayerStats], batches: int) -> None:
        self.stage = stage
        self.stats = stats
        self.order = {i: k + 1 for k, i in enumerate(stats)}
        self.batches = batches
        self.batch = 0
        self.layer = 0
        self.done = 0.0
        if stage is not None:
            stage.total = batches * len(stats) + sum(s.n_stored for s in stats.values())

    def where(self) -> str:
        return f"layer {self.order[self.layer]}/{len(self.stats)}"

    def capture(self, i: int, h: np.ndarray) -> None:
        self.layer = i
        self.stats[i].add(h, self.tick_batch)
        self.done += 1

    def tick_batch(self, k: int, n: int) -> None:
        if self.stage is not None:
            detail = f"batch {self.batch}/{self.batches}  {self.where()}  expert {k}/{n}"
            self.stage.update(self.done + k / max(n, 1), detail)

    def tick_result(self, k: int, n: int) -> None:
        if self.stage is not None:
            self.stage.update(self.done + k, f"statistics  {self.where()}  expert {k}/{n}")


class LayerByLayer:
    """Calibration of a transformer whose decoder layers come one at a time (`colibri convert
    --calib`, streamed): the fp32 reference's residual stream of every calibration sequence
    ([T, d_model] float64 each, from the embedding of `head`) is carried from one layer to the
    next, so memory holds one layer's weights and statistics, never the model's. Each MoE
    layer's statistics are :func:`transformer_calibration`'s to the bit (the same operations
    on each sequence, the sequences in the same order)."""

    def __init__(self, head: MoETransformer, sequences: list[np.ndarray]) -> None:
        self.config = head.config
        self.x = [head.embed[np.asarray(s, np.int64)].astype(np.float64) for s in sequences]

    @property
    def tokens(self) -> int:
        return sum(x.shape[0] for x in self.x)

    def advance(
        self,
        i: int,
        layer: DecoderLayer,
        hidden_rows: bool = False,
        tick: Callable[[str, int, int], None] | None = None,
    ) -> LayerCalib | None:
        """Run decoder layer `i` over every sequence (a fresh KV cache each); its calibration
        statistics when it is a MoE layer, else None. `tick(part, k, n)`: "batch" after each
        of the n sequences, then "statistics" after each of the n stored experts.
        `hidden_rows`: as :func:`transformer_calibration`."""
        stats = _LayerStats(layer.moe) if layer.moe is not None else None

        def capture(_: int, h: np.ndarray) -> None:
            assert stats is not None
            stats.add(h)

        for k, x in enumerate(self.x):
            self.x[k] = layer_forward(self.config, layer, x, KVCache(), i, 0, capture)
            if tick is not None:
                tick("batch", k + 1, len(self.x))
        if stats is None:
            return None

        def per_expert(k: int, n: int) -> None:
            if tick is not None:
                tick("statistics", k, n)

        return stats.result(per_expert, hidden_rows)


def layer_heat(moe: MoELayer, lc: LayerCalib) -> np.ndarray:
    """float32 [n_experts]: the share of the layer's calibration tokens routed to each stored
    expert (:func:`expert_heat` of one layer)."""
    heat = np.zeros(moe.config.n_experts, np.float32)
    for e, st in lc.experts.items():
        heat[e] = st.hits / max(lc.tokens, 1)
    return heat


def expert_heat(model: MoETransformer, calib: dict[int, LayerCalib]) -> dict[int, np.ndarray]:
    """Per MoE layer (by index), float32 [n_experts]: the share of its calibration tokens
    routed to each stored expert (0 for an expert that uses another's weights, and for one the
    calibration never chose): the heat `colibri convert --calib` stores as ``layer.{i}.heat``
    and the runtime pins the hottest experts by. Shares are comparable across layers (each
    layer's sum is at most its top_k)."""
    out: dict[int, np.ndarray] = {}
    for i, lc in sorted(calib.items()):
        moe = model.layers[i].moe
        if moe is None:
            continue
        out[i] = layer_heat(moe, lc)
    return out


# -- calibration token ids -----------------------------------------------------------------------

_IDS_HINT = (
    "--calib for a whole transformer takes token ids (an integer .npy, 1-D or [N, T] for N "
    "sequences) or a UTF-8 text file"
)


def split_sequences(ids: np.ndarray, max_len: int) -> list[np.ndarray]:
    """Rows of ids [N, T] (or one 1-D sequence) cut into pieces of at most max_len tokens."""
    seqs = [ids] if ids.ndim == 1 else list(ids)
    out: list[np.ndarray] = []
    for s in seqs:
        out.extend(s[i : i + max_len] for i in range(0, s.shape[0], max_len))
    return out


def check_calib_ids(ids: np.ndarray, vocab_size: int, source: str) -> np.ndarray:
    """Calibration token ids as int64 (1-D or [N, T]); InputError naming the fix when the
    dtype, shape or values are wrong or there are none."""
    arr = np.asarray(ids)
    if arr.dtype.kind == "f":
        raise InputError(
            f"{source}: dtype {arr.dtype}, but {_IDS_HINT}; a float [T, d_model] array is "
            f"calibration activations for a single MoE layer (pass --layer N)"
        )
    if arr.dtype.kind not in "iu":
        raise InputError(f"{source}: dtype {arr.dtype}, but {_IDS_HINT}")
    if arr.ndim not in (1, 2):
        raise InputError(f"{source}: shape {arr.shape}, but {_IDS_HINT}")
    if arr.size == 0:
        raise InputError(f"{source}: no token ids (shape {arr.shape}); {_IDS_HINT}")
    bad = (arr < 0) | (arr >= vocab_size)
    if bad.any():
        first = int(arr[bad].ravel()[0])
        raise InputError(
            f"{source}: token id {first} is outside the vocabulary (0..{vocab_size - 1}; "
            f"{int(bad.sum())} ids out of range); pass ids of this model's tokenizer"
        )
    return arr.astype(np.int64)


def text_ids(path: Path, vocab_size: int, tokenizer: Path | None) -> np.ndarray:
    """Token ids of a UTF-8 text file: with tokenizer.json's tokenizer, else one id per byte
    (vocabularies of >= 256 ids, as `colibri run --prompt`)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read the calibration text ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(
            f"{path}: not UTF-8 text; {_IDS_HINT} (token ids go in a .npy file)"
        ) from None
    if not text.strip():
        raise InputError(f"{path}: the calibration text is empty; pass some text of the domain")
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        tok.check_vocab(vocab_size)
        ids = tok.encode(text)
    elif vocab_size >= 256:
        ids = list(text.encode("utf-8"))
    else:
        raise ConfigError(
            f"{path}: calibration text needs a tokenizer: the checkpoint has no tokenizer.json "
            f"and its vocabulary ({vocab_size} ids) is too small for one token per byte; put "
            f"the checkpoint's tokenizer.json beside its config.json, or pass token ids as an "
            f"integer .npy"
        )
    if not ids:
        raise InputError(f"{path}: the calibration text encodes to no tokens")
    return np.asarray(ids, dtype=np.int64)


def load_calib_ids(
    calib: str | Path | np.ndarray, model: MoETransformer, max_len: int
) -> list[np.ndarray]:
    """The calibration sequences of a whole transformer (module docstring): an array of ids,
    an integer .npy or a text file (tokenized with the tokenizer.json beside the checkpoint)."""
    vocab = model.config.vocab_size
    if isinstance(calib, np.ndarray):
        ids = check_calib_ids(calib, vocab, "calibration ids")
    else:
        path = Path(calib)
        if not path.is_file():
            raise InputError(f"{path}: --calib file not found; {_IDS_HINT}")
        if path.suffix == ".npy":
            ids = check_calib_ids(load_npy(path, "--calib file", _IDS_HINT), vocab, str(path))
        elif path.suffix in (".npz", ".pt", ".bin", ".safetensors"):
            raise InputError(f"{path}: not a .npy or text file; {_IDS_HINT}")
        else:
            src = Path(model.source) if model.source else None
            ckpt = src if src is not None and src.is_dir() else (src.parent if src else None)
            tok = ckpt / "tokenizer.json" if ckpt is not None else None
            ids = text_ids(path, vocab, tok if tok is not None and tok.is_file() else None)
    return split_sequences(ids, max_len)
