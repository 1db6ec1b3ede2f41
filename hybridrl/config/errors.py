"""The error a bad config raises, listing every problem found; the base of the errors that stop a run with a
message saying what to do."""

__all__ = ["ConfigError", "RunStopError"]


class RunStopError(Exception):
    """An error that stops a run (a checkpoint that cannot be resumed or saved, too many failed rewards, a locked
    run directory...) with a message naming the file or setting and what to do: the CLI prints the message alone,
    without a traceback, and exits with 1."""


class ConfigError(ValueError):
    """A bad config. `.errors` lists every problem found (each names its key)."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        head = "invalid config" if len(errors) == 1 else f"invalid config ({len(errors)} problems)"
        super().__init__(head + ":\n  - " + "\n  - ".join(self.errors))
