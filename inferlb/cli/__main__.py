"""``python -m inferlb.cli``: the ``inferlb`` command (inferlb/cli/main.py)."""

import sys

from inferlb.cli.main import main

sys.exit(main())
