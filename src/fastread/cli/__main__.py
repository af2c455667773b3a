"""``python -m fastread.cli``: the same as the ``fastread`` console script."""
import sys

from fastread.cli import main

sys.exit(main())
