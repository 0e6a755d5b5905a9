"""What an installed CLI offers besides its commands: the version and shell completion."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import ftorch

from orchestrator import __version__


def test_version() -> None:
    done = ftorch("--version")
    assert done.returncode == 0 and done.stdout == f"ftorch {__version__}\n"


def test_bash_completion_lists_commands_and_options() -> None:
    env = {**os.environ, "_FTORCH_COMPLETE": "complete_bash", "COMP_WORDS": "ftorch la", "COMP_CWORD": "1"}
    main = "import sys; sys.argv[0] = 'ftorch'; from orchestrator.cli.app import main; main()"
    cmd = [sys.executable, "-c", main]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["launch"], done
    env.update(COMP_WORDS="ftorch launch --dr", COMP_CWORD="2")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["--dry-run"], done
