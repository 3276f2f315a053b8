"""``python -m archplace.cli ...`` = ``archplace ...``."""

import sys

from archplace.cli.commands import main

sys.exit(main())
