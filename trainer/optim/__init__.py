"""The optimizer: AdamW's implementation per device, and the optimizer step in backward."""
