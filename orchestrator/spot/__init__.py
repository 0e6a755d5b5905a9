"""Spot capacity: availability traces, the spot / on-demand policies, the simulator and the cloud controller."""
