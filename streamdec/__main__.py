"""``python -m streamdec``: the ``streamdec`` command."""

from __future__ import annotations

from .cli import main

# Guarded: a spawned worker process (the warm-up's parallel Triton compiles) imports the main module
# again, and must not run the command a second time.
if __name__ == "__main__":
    raise SystemExit(main())
