"""The benchmarks behind `zerobubble bench ...`: they sit above the services and start them as a user would."""
