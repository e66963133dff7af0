"""`python -m colibri` entry point (Ctrl-C is quiet from here on, also during the imports)."""

try:
    from .cli import entry
except KeyboardInterrupt:  # pragma: no cover - a window of microseconds
    raise SystemExit(130) from None

raise SystemExit(entry())
