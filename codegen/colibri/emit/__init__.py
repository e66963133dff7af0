"""Stage 6, emission: quantised IR + plan -> C sources and a manifest, from Jinja2 templates.

``weights`` is the one weights writer (every stored tensor's declaration and initialiser, named
once, bytes counted per part); ``layer`` and ``transformer`` render the two kinds of generated
directory from ``templates/`` (the per-expert FFN kernels of both come from one template macro,
``templates/common/experts.j2``); ``cformat`` makes C identifiers and literals and lays out
the lines whose length depends on the model; ``output`` holds the file names per kind, the
Jinja2 environment and the atomic directory writer; ``container`` writes the Colibri container
(version 1, one MoE block, and the image of either version, in the format
:mod:`colibri.frontends.container` defines); ``lmfile`` writes a whole transformer as one
container, version 2 (and reads it back as model + quantisation): the same stored bytes, run by
the runtime's colibri_lm_* entry points with nothing compiled per model.
"""
