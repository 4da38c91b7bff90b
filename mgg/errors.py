"""The errors mgg raises for bad input, bad configuration and missing resources.

Every one is an :class:`MggError`, whose message names the input (a file, a flag, a
checkpoint) and says what is wrong with it; ``mgg`` prints it as one line and exits 2.
Each also derives from the builtin a Python caller would expect (ValueError,
MemoryError, ...), so ``except ValueError`` keeps working. Anything else that escapes
is a bug in mgg and keeps its traceback.
"""

from __future__ import annotations


def one_line(e: BaseException) -> str:
    """An error as one line for people: an OSError naming a file as ``FILE: why``, else its
    text (or, without one, its type's name)."""
    if isinstance(e, OSError) and e.filename is not None and not isinstance(e, MemoryError):
        return f"{e.filename}: {e.strerror or e}"
    return str(e) or type(e).__name__


def first_line(e: BaseException, limit: int = 200) -> str:
    """The first line of an error's text (at most ``limit`` characters), or its type's
    name: a library's multi-line message (torch's readers) inside one of mgg's."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:limit]


class MggError(Exception):
    """A user-facing error: the message names the input and the problem."""


class InputError(MggError, ValueError):
    """A value given to mgg (a flag, a config, an argument) is invalid."""


class ArgumentTypeError(InputError, TypeError):
    """An argument of the wrong type (not a tensor, not the job's DistGraph): an
    InputError that ``except TypeError`` catches too."""


class GraphError(InputError):
    """A graph or dataset, or a file holding one, is malformed."""


class CheckpointError(InputError):
    """A checkpoint file cannot be read, or does not fit this job."""


class ResourceError(MggError, MemoryError):
    """What a command would allocate exceeds what this rank (or device) has."""


class DivergedError(MggError, FloatingPointError):
    """Training produced a non-finite loss or weights."""


class LaunchError(MggError, RuntimeError):
    """The job was launched wrongly (rank counts, environment, a missing command)."""


class ModelError(InputError):
    """A saved model (mgg train --save) cannot be read, or does not fit the job."""
