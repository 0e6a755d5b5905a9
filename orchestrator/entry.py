"""The `ftorch` console script: the commands that must answer at once, without the CLI framework.

`ftorch --help` (and bare `ftorch`) print orchestrator/cli/fast_help.py's list; the plain `ftorch status` forms
run orchestrator/cli/status_command.py. Importing typer (with click, rich's markdown, pydantic) costs more than
a status read over 1,000 jobs, so these skip it; everything else (other commands, `status --help`, typos)
goes to orchestrator.cli.app, which parses and reports as before.
"""

from __future__ import annotations

import os
import sys

from orchestrator.cli.status_command import fast_status


def main() -> None:
    from orchestrator.home import owner_only_umask

    owner_only_umask()
    argv = sys.argv[1:]
    if "_FTORCH_COMPLETE" in os.environ:  # shell completion (click's protocol): typer answers it
        from orchestrator.cli import app as cli

        cli.main()
        return
    if argv in ([], ["--help"]):  # typer: help on stdout; exit 2 without arguments (no_args_is_help)
        from orchestrator.cli.fast_help import render

        sys.stdout.write(render("ftorch") + "\n")
        sys.exit(2 if not argv else 0)
    fast = fast_status(argv)
    if fast is None:
        from orchestrator.cli import app as cli

        cli.main()
        return
    from orchestrator.errors import SpecError, UserError

    try:
        code = _status(fast)
    except (SpecError, UserError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # as orchestrator.cli.app.main reports it
        sys.stderr.write(f"error: {exc.__class__.__name__}: {exc}\n")
        sys.exit(1)
    if code:
        sys.exit(code)


def _status(options: dict[str, object]) -> int:
    from orchestrator.cli import status_command

    return status_command.run(**options)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
