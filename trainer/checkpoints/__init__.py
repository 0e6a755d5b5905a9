"""Checkpoints: what one holds, when and how it is written (whole or sharded, sync or async) and read back."""
