"""What an item's ``last_error`` keeps of a failure: one line, then the application's frames."""

from __future__ import annotations

import os
import traceback

from .._errors import SuperviseError

__all__ = [
    "MAX_TRACEBACK_CHARS",
    "MAX_TRACEBACK_FRAMES",
    "application_frames",
    "describe_error",
    "describe_failure",
    "first_line",
]


def describe_error(error: BaseException) -> str:
    """One line for ``last_error``: our own errors by message, others with their type."""
    text = str(error)
    if isinstance(error, SuperviseError) and text:
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


MAX_TRACEBACK_FRAMES = 8
"""Frames of a driver's traceback kept with the item's error (the innermost ones)."""

MAX_TRACEBACK_CHARS = 4000
"""Characters of traceback kept with the item's error at most (the end of it)."""

_LIBRARY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def describe_failure(error: BaseException) -> str:
    """What ``last_error`` keeps of an evaluation's *error*: :func:`describe_error`'s line, then
    the traceback trimmed to the application's frames (the library's own left out, at most the
    innermost ``MAX_TRACEBACK_FRAMES``, ``MAX_TRACEBACK_CHARS``), or the line alone when every
    frame is the library's (a config that does not fit, no driver). The first line is always
    :func:`describe_error`'s, so ``last_error.partition("\\n")[0]`` is the one-line summary."""
    line = describe_error(error)
    frames = application_frames(error)
    if not frames:
        return line
    kept = frames[-MAX_TRACEBACK_FRAMES:]
    header = "Traceback (most recent call last; trio_supervise's frames left out"
    header += f", {len(frames) - len(kept)} more above):" if len(kept) < len(frames) else "):"
    text = "".join(traceback.format_list(kept)).rstrip("\n")
    if len(text) > MAX_TRACEBACK_CHARS:
        text = "  ...\n" + text[-MAX_TRACEBACK_CHARS:]
    return f"{line}\n{header}\n{text}"


def application_frames(error: BaseException) -> list[traceback.FrameSummary]:
    """*error*'s traceback frames outside the library (a driver's, an application's)."""
    return [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not os.path.abspath(frame.filename).startswith(_LIBRARY_DIR)
    ]


def first_line(error: str | None) -> str:
    """The one-line summary of a stored error (see :func:`describe_failure`); "" for None."""
    return "" if error is None else error.partition("\n")[0]
