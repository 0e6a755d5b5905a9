"""The model: loading (whole, 4-bit, sharded for FSDP), attention choice and the checks no retry can fix."""
