"""``python -m luxun ...`` is the ``luxun`` command."""

import sys

from .cli import main

sys.exit(main())
