"""MLflow tracking: a stage's run from start to end, what a run was and where it came from, and the runs read back."""
