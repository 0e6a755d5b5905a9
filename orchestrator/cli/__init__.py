"""The `ftorch` command line: one module per group of commands, and the follow/watch views they drive. Top floor: may import everything in orchestrator/."""
