"""Backends that run a job: the local supervisor (embedded default) and SkyPilot managed jobs."""
