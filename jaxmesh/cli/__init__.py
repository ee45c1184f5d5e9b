"""The ``jaxmesh`` command line.

The commands and their flags: ``jaxmesh --help`` and docs/cli.md.

The package, one file per job: ``parser`` (the commands and their flags),
``config`` (a run config's keys, one table, and reading it from YAML),
``checks`` (checking a config), ``build`` (the policy, env and ``evaluate``
arguments it names), ``outputs`` (where each file goes, checked before a
run), ``artifacts`` (videos and the HTML report), ``hooks`` (the progress bar
and the episode log's start), ``tls``, ``cache`` (the compilation cache's
switch), and one module per command family: ``eval``, ``sweep``, ``explain``
(explain, describe), ``results`` (compare, report), ``decide``, ``serve``
(check-env, serve-env), ``serve_policy`` (serve-policy). A command's module is imported
only when it runs: ``--help`` and ``--version`` import no JAX.

Exit status: 0 on success; 2 for bad input (the command line, the config, or
anything ``jaxmesh.evaluate`` refuses before the run starts), reported as one
line on stderr; an error raised while the run is going keeps its traceback
(status 1); 130 after Ctrl-C, 143 after SIGTERM (eval).
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
    """Runs the ``jaxmesh`` command line; returns the exit status.

    Args:
      argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
      0 on success, 2 for bad input (one line on stderr). An error raised while
      a run is going propagates with its traceback.
    """
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
