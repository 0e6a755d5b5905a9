"""Why training stops: preemption notices, stop requests through the run store, the interruption model."""
