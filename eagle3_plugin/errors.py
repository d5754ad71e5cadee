"""One exception type for every user-facing error, so the CLI can print it as one clear line."""


class Eagle3Error(Exception):
    """Bad input (config, checkpoint, data, prompt file): the message says what and where."""
