"""`zerobubble view RUN_DIR`: a read-only local web page of a run, finished or running: its curves and evaluations,
the rollout log as a list that pages through it, each group's samples and each sample's tokens."""
