"""What runs in the tinker-cookbook's environment (.venv-cookbook, deploy/tinker-cookbook/), not in the project's:
the cookbook's own training loops driven by their own config classes (loops.py), and the demo's task as a
cookbook RL environment (sums.py). Nothing here imports the project; both files run as scripts of that
environment's interpreter, talking to a Tinker front over HTTP."""
