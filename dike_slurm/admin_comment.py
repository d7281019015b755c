"""The AdminComment the engine writes on a job: `dike:level=1,attained=3.2gpuh[,promoted]`.

No spaces: the line-fed writer (backends/scontrol_stdin.py) sends a value with whitespace as a
process of its own. Comments in the older form `dike:level=1 attained=3.2gpuh` are still the
engine's own (`comment_level` reads both) and are rewritten with the next level change.

Built from the engine's own numbers only, never from job names or comments. A comment that
does not start with the prefix belongs to an admin and is never overwritten.
"""

from __future__ import annotations

import re

PREFIX = "dike:"
_LEVEL = re.compile(r"^dike:level=(\d+)\b")


def admin_comment_text(level: int, attained_gpu_s: float, promoted: bool) -> str:
    """The AdminComment the engine writes for a job at this level with this attained service."""
    text = f"{PREFIX}level={level},attained={attained_gpu_s / 3600:.1f}gpuh"
    return text + ",promoted" if promoted else text


def comment_level(comment: str) -> int | None:
    """The level an engine-written AdminComment names; None for any other comment."""
    match = _LEVEL.match(comment)
    return int(match.group(1)) if match else None


def is_engine_comment(comment: str) -> bool:
    """Whether the engine may write this job's AdminComment: empty, or one it wrote itself."""
    return comment == "" or comment.startswith(PREFIX)
