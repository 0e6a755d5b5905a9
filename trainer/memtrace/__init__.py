"""Tracing memory on the CPU with fake tensors: one training step, the loading phase, and the CUDA caching allocator model they feed."""
