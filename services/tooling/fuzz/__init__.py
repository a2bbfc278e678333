"""The fuzz suite's parts, shared by tests/tooling/fuzz and `zerobubble bench fuzz`: messages generated from the
contracts, raw HTTP/2 and socket abuse, the services under fuzz and the judging of their answers. Needs the `dev` extra
(hypothesis, h2)."""
