"""`python -m colibri` entry point."""

from .cli.main import main

raise SystemExit(main())
