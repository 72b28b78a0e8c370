"""Subcommands of this package (filled in by the owning issue)."""


def register(sub) -> None:
    pass
