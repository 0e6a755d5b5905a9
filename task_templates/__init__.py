"""SkyPilot task templates (single GPU, one multi-GPU node, several nodes), shipped as package data.

orchestrator/backends/skypilot_render.py fills in what depends on the job.
"""
