"""``python -m jaxmesh.cli``: the ``jaxmesh`` command."""

import sys

from jaxmesh.cli import main

sys.exit(main())
