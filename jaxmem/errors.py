"""The one exception type for bad input: the CLI prints its message on one line and exits 2."""


class JaxmemError(ValueError):
  """A user-facing error: what was wrong and how to fix it, in one line."""
