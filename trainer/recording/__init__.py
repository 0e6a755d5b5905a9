"""Recorders the loop calls at its named points (trainer/observers.py): progress, trackers, measurements, notifications, the cost ledger. They never change the training state."""
