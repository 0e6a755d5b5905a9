"""Training health (train.health): the torch-free rules, and the guard that applies them in the loop."""
