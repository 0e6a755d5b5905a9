"""Helpers the tests and bench/ share (bench scripts put tests/ on sys.path and import `support.*`)."""
