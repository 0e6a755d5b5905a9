"""GPU memory: the allocator's settings and model, the load peak, and a traced training step."""
