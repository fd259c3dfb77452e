"""``python -m store``: the operator's command line (see :mod:`store.runs.cli`)."""

import sys

from .runs.cli import main

sys.exit(main())
