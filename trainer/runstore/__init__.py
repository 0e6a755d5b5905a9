"""The run store: one folder per run on any fsspec filesystem, and the records in it. No torch here."""
