"""ftorch's orchestrator: job files, sizing, planning, backends, registry and CLI.

Nothing here imports torch or sky at module level: the CLI must stay fast.
"""

__version__ = "0.1.0"
