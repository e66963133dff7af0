"""Stage 1, the model IR: what Colibri compiles, as dataclasses of numpy arrays.

``moe`` holds one MoE block (:class:`~colibri.ir.moe.MoELayer`: router, experts, optional
shared expert, sharing map) with its config and content hash; ``transformer`` a whole
decoder-only model (:class:`~colibri.ir.transformer.MoETransformer`) whose layers hold MoE
blocks or dense MLPs; ``model`` the one IR every stage takes (:class:`~colibri.ir.model.Model`,
kind "layer": one MoE block alone, kind "transformer": a whole decoder around its MoE blocks).
Every later stage reads only these; nothing here reads files.
"""
