"""Sizing a job: the model's shape, the memory per GPU (estimated or traced) and the time per step."""
