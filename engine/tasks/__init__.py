"""Per-task hooks: detect, segment, pose, classify (the modules of this package). Where each task's scripts are
is `engine.messages.SCRIPTS`, on the floor below, since the base classes name them."""
