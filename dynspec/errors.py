"""One error type for bad input. The CLI prints its message on one line and exits 2."""


class DynspecError(ValueError):
    """Bad input: the message names the file, field or value at fault."""
