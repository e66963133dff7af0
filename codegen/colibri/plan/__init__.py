"""Stage 5, planning: where everything lives on the board, decided before any C is written.

``memory`` is the one static-arena planner (named regions at fixed offsets, for a lone layer
and for a whole decoder with its KV cache); ``placement`` puts each stored expert in flash or
RAM with a kernel variant from its routing heat; ``model`` has the one planning entry,
``plan(model, ...)``, for either kind (cache slots, RAM budget, placement, arena); ``budget``
refuses a model that does not fit the board and names the quantisation that would.
"""
