"""The ``jaxmesh`` command line: its commands, flags and exit statuses are in
docs/cli.md ("Exit status"; also 143 after SIGTERM). ``parser`` names each
command's function as ``"module:function"``, imported only when it runs:
``--help`` and ``--version`` import no JAX.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

from jaxmesh.cli.errors import ConfigError, Interrupted
from jaxmesh.cli.parser import make_parser
from jaxmesh.trace import redact_text, secret_values


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line on ``argv`` (default: ``sys.argv[1:]``); returns the
    exit status (bad input: 2, one line on stderr; an error while a run goes
    propagates with its traceback)."""
    # As ``python -m`` does: a config's ``policy: mymodule:fn`` names a module
    # in the working directory (the console script leaves it off sys.path).
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        args = make_parser().parse_args(argv)
    except SystemExit as e:  # argparse already printed the message
        return int(e.code or 0)
    module, _, name = args.run.partition(":")
    try:
        run = getattr(importlib.import_module(f"jaxmesh.cli.{module}"), name)
        return run(args)
    except Interrupted as e:
        return e.status
    except ConfigError as e:
        # No secret is echoed: the token given on the command line or in
        # $JAXMESH_TOKEN (a config's token is taken out where it is read).
        given = {"token": getattr(args, "token", None)}
        line = " ".join(part.strip() for part in str(e).splitlines() if part.strip())
        line = redact_text(line, secret_values(given))
        print(f"jaxmesh {args.command}: error: {line}", file=sys.stderr)
        return 2


__all__ = ["main"]
