"""Slurm hostlist expressions (`n[01-16,20]`), through the python-hostlist library."""

from __future__ import annotations

import hostlist

from dike_slurm.errors import InputError

_NO_HOSTS = frozenset({"", "None assigned", "(null)", "None"})


def expand_hostlist(text: str) -> tuple[str, ...]:
    """All host names of a hostlist expression, in order; () for `None assigned`."""
    raw = (text or "").strip()
    if raw in _NO_HOSTS:
        return ()
    try:
        return tuple(hostlist.expand_hostlist(raw))
    except hostlist.BadHostlist as exc:
        raise InputError(f"bad hostlist {text!r}: {exc}") from None


def compress_hostlist(hosts: list[str] | tuple[str, ...]) -> str:
    """The shortest hostlist expression for these hosts (`n[1-4]`)."""
    return hostlist.collect_hostlist(list(hosts)) if hosts else ""
