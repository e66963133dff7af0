"""Stage 8, report: pictures of what the earlier stages measured, as self-contained pages.

``html`` holds the page skeleton (inline CSS and SVG, no network, every number written into the
DOM as text), tables, the budget bar and atomic file writing; ``treemap`` is a squarified
treemap layout and its SVG; ``sizes`` draws `colibri size --html / --svg` (flash and RAM by
section, runtime module and expert, with the board's budget line); ``routing`` draws the routing
heat map `colibri generate --calib` writes beside the generated C (experts x calibration tokens,
hits per expert and the imbalance figure, max hits / mean hits) and its Markdown table.
"""
