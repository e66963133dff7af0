"""Stage 9, the driver: the `colibri` command line and the pipelines it runs.

``pipeline`` is `colibri generate` as its stages in order (load -> IR -> quantise -> analyse ->
plan -> emit -> budget -> write), ``export`` is `colibri export` (read a PyTorch block, write
the container, check it against PyTorch), ``main`` parses the command line and prints one-line
errors.
"""
