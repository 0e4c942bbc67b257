"""Speed, accuracy, memory and structure figures (not assertions): `python -m benchmarks.NAME` from the root."""
