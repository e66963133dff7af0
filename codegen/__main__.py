"""`python -m colibri` entry point."""

from .cli import main

raise SystemExit(main())
