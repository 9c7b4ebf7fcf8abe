"""Did this code run? A profile hook that notices a call, whoever made it, chained with any
hook already set (the grade's :class:`labkit.delegation.watch_references`)."""
from __future__ import annotations

import sys


class code_ran:
    """Context manager: ``found`` is True once a Python call's code satisfies ``match(code)``,
    whoever called it (a generator the check iterates counts too); chained with any profile hook
    already set, such as the grade's :class:`~labkit.delegation.watch_references`."""

    def __init__(self, match):
        self.found = False
        self._match = match

    def __enter__(self):
        self._previous = sys.getprofile()
        sys.setprofile(self._hook)
        return self

    def _hook(self, frame, event, arg):
        if self._previous is not None:
            self._previous(frame, event, arg)
        if event == "call" and not self.found and self._match(frame.f_code):
            self.found = True

    def __exit__(self, *exc):
        sys.setprofile(self._previous)
        return False
