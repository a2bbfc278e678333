"""The bubblewrap sandbox that runs untrusted programs: the reward service's code verifier and the environment
service's Python tool share it."""
