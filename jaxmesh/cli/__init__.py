"""The ``jaxmesh`` command line: its one module, moved into this package to
be split by what each part does."""

from jaxmesh.cli.checks import *  # noqa: F403
from jaxmesh.cli.checks import main as main
