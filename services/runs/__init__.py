"""What is done with a finished or running run folder: its plot."""
