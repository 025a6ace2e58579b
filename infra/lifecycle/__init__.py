"""The run's processes from start to stop: servers checked first, the process tree, signals and cancels, the clock."""
