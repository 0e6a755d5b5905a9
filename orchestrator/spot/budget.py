"""The budget rule lives with the job (trainer/stops/budget.py: the trainer stops itself, on every backend);
re-exported here for the planner and the local supervisor's check before it starts an attempt."""

from trainer.stops.budget import MARGIN_S, BudgetGuard

__all__ = ["MARGIN_S", "BudgetGuard"]
