"""The one model IR: everything Colibri compiles is a :class:`Model`, a stack of MoE blocks.

A lone MoE layer is a model of kind "layer": one MoE block and no embedding, attention or
norms (``decoder`` is None). A whole decoder is kind "transformer": the same blocks, one per
MoE decoder layer, inside the :class:`~colibri.ir.transformer.MoETransformer` that adds the
embedding, attention, norms, dense MLPs and LM head. The load stage returns a Model and every
stage of ``colibri generate`` takes one; the manifest's "kind" is :attr:`Model.kind`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .moe import MoELayer
from .transformer import MoETransformer

#: The kinds of model (and of generated directory: manifest.json "kind").
KINDS = ("layer", "transformer")


@dataclass(frozen=True)
class Model:
    """MoE blocks in layer order, and the decoder around them (None: one MoE layer alone)."""

    blocks: tuple[MoELayer, ...]
    decoder: MoETransformer | None = None

    @property
    def kind(self) -> str:
        return KINDS[self.decoder is not None]

    @property
    def layer(self) -> MoELayer:
        """The MoE block of a lone layer (kind "layer")."""
        assert self.decoder is None, "a whole transformer is not one MoE layer"
        return self.blocks[0]


def as_model(ir: Model | MoELayer | MoETransformer) -> Model:
    """The Model of an IR: a lone MoE layer as one block, a transformer with its MoE blocks."""
    if isinstance(ir, Model):
        return ir
    if isinstance(ir, MoELayer):
        return Model((ir,))
    return Model(tuple(layer.moe for layer in ir.layers if layer.moe is not None), ir)
