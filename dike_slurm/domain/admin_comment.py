"""The AdminComment the engine writes on a job: `dike:level=1,attained=3.2gpuh[,promoted]`.

No spaces: the line-fed writer (backends/scontrol_stdin.py) sends a value with whitespace as a
process of its own. Comments in the older form `dike:level=1 attained=3.2gpuh` are still the
engine's own (`comment_level` reads both) and are rewritten with the next level change.

Built from the engine's own numbers only, never from job names or comments. A comment that
does not start with the prefix belongs to an admin and is never overwritten.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "dike:"
_LEVEL = re.compile(r"^dike:level=(\d+)\b")
_PUBLISHED = re.compile(r"^dike:level=(\d+)[, ]attained=(\d+(?:\.\d+)?)gpuh(,promoted)?$")


@dataclass(frozen=True)
class Published:
    """What the engine published on a job: its level, and its attained service when it last wrote it."""

    level: int
    attained_gpu_hours: float
    promoted: bool


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


def published(comment: str) -> Published | None:
    """The engine's numbers in an AdminComment it wrote; None for any other comment.

    This is the narrow read users get under PrivateData=jobs: Slurm shows a job's AdminComment
    to whoever may see the job, and to no one else.
    """
    match = _PUBLISHED.match(comment)
    if match is None:
        return None
    return Published(int(match.group(1)), float(match.group(2)), match.group(3) is not None)
