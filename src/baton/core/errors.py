"""Error types whose messages are shown to users as one line."""


class BatonError(Exception):
    """Base class of user-facing errors: the CLI prints the message, never a traceback."""


class ConfigError(BatonError):
    """A configuration value is missing or has the wrong type or range; the message names the key."""


class WorkloadError(BatonError):
    """A trace file is missing or malformed; the message names the file and line."""


def did_you_mean(name: str, known) -> str:
    """`` (did you mean 'x'?)`` for the closest known name, or an empty string."""
    import difflib
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
