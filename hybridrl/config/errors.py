"""The error a bad config raises, listing every problem found."""

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A bad config. `.errors` lists every problem found (each names its key)."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        head = "invalid config" if len(errors) == 1 else f"invalid config ({len(errors)} problems)"
        super().__init__(head + ":\n  - " + "\n  - ".join(self.errors))
