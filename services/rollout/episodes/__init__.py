"""Multi-turn episodes: the rollout worker plays a prompt row out in an environment over several turns.

sessions.py is what the worker needs of the environment service, render.py turns messages into the tokens between
turns, driver.py plays a batch of episodes turn by turn over the engine, and play.py mixes them with single-turn rows.
"""
