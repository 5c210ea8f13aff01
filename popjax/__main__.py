"""``python -m popjax``: the ``popjax`` command."""

import sys

from popjax.cli import main

sys.exit(main())
