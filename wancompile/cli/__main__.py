"""``python -m wancompile.cli``: the console script."""

import sys

from wancompile.cli import main

sys.exit(main())
