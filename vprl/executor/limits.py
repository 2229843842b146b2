"""How much of an unbounded text the executor keeps when it quotes one: one name per cut.

Errors, traces and protocol complaints quote what a program, a model or an exception produced;
each cut keeps a result small and stops a hostile program from flooding the trainer's logs.
"""

from __future__ import annotations

MAX_ERROR = 500  # an error message a result keeps (the LLM reads it when re-prompted)
MAX_MESSAGE = 300  # a one-line message around an exception's repr or a program's argument
MAX_TRACE = 200  # a tool result, a tool failure or an answer as a trace or report quotes it
MAX_SNIPPET = 80  # a line of program source or a malformed argument quoted in an error
MAX_NAME = 40  # a name or value quoted from a program or a frame (an op, a method, an image ref)
# The error a sandbox reports: the program side cuts it to MAX_ERROR, but a hostile program can
# send its own frame, so the supervisor cuts again, more loosely.
MAX_SANDBOX_ERROR = 1000
MAX_STDOUT = 10_000  # characters of a program's printed output a result keeps
