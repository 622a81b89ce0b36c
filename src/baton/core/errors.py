"""Error types whose messages are shown to users as one line."""


class BatonError(Exception):
    """Base class of user-facing errors: the CLI prints the message, never a traceback."""


class ConfigError(BatonError):
    """A configuration value is missing or has the wrong type or range; the message names the key."""


class WorkloadError(BatonError):
    """A trace file is missing or malformed; the message names the file and line."""
