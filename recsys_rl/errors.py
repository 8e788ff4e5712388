"""The base class of failures a user can act on, which the CLI prints as one line instead of a traceback.

Anything else escaping a command is a bug, and its traceback is what a bug report needs.
"""


class OperationalError(RuntimeError):
    """A failure caused by the environment or the data (broker down, corrupt dataset), not by our code."""
