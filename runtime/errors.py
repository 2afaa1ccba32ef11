"""Errors a user can act on: printed as one line, never as a traceback."""


class UserError(Exception):
    """Something the user must fix; the message says what to do."""
