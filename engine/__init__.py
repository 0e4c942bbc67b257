"""The engine: one training loop, one validation loop, one prediction loop, and the task hooks over them."""
