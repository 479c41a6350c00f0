"""``python -m flashinfer``: the same as the ``flashinfer`` command (see :mod:`flashinfer.cli`)."""

import sys

from .cli import main

sys.exit(main())
