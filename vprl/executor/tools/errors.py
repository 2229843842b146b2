"""The two ways a tool call fails: the program's fault (`ToolError`) or ours (`ToolUnavailable`)."""

from __future__ import annotations


class ToolError(Exception):
    """A tool refused a call because of what the program asked (bad arguments): a program error."""


class ToolUnavailable(Exception):
    """A tool could not answer for reasons of ours (backend down, not configured): infra error."""
