"""ftorch's trainer: runs where the GPUs are. It never imports `orchestrator`."""
