"""``python -m fastread.cli``: the same as the ``fastread`` console script."""
import sys

from fastread.cli import main

# Guarded: worker processes started by a forkserver import this module
# again (as __mp_main__), which must not run the command a second time.
if __name__ == "__main__":
    sys.exit(main())
