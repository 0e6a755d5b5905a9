"""Jobs as a user drives them: launch, logs, cancel, resume, sweeps and adopted runs, backend-neutral. May import everything below the CLI."""
