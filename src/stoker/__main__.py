"""``python -m stoker`` (also under ``torchrun``)."""

import sys

from .cli import main

sys.exit(main())
