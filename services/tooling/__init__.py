"""Above the services, and apart from them: the `zerobubble` command, the launcher behind `up`, the benchmarks,
the fuzz suite, the tiny model and its task, plots, and the run configs that ship with the package. Nothing in
services/common, reward, buffer, rollout or trainer imports from here."""
