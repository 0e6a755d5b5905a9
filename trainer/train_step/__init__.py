"""One optimizer step: the loss path, accumulation, out-of-memory adaptation and the packing check."""
