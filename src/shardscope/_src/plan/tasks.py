"""Tasks that run themselves: what the planner sends to a worker process or a Ray worker, and
what comes back when a task cannot give its answer.

A task is a picklable record with a ``run()`` that does its own work on the devices of the
process it runs in: :class:`~shardscope._src.train.compile.CompileTask` compiles one plan of
the built-in model, :class:`~shardscope._src.program.program.ProgramTask` one candidate of a
user's program. Each lives beside the work it runs, so that the worker's loop and the Ray
pool need know no task type: they call :func:`run_task`, and unpickling a task imports the
module that runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from shardscope._src.base import errors
from shardscope._src.base.errors import ShardscopeError

if TYPE_CHECKING:
    import jax


class Task(Protocol):
    """One compile, run where it is sent: ``devices`` to compile on (None: the first ones
    of the process that runs it, as many as the task's mesh needs)."""

    def run(self, devices: Sequence[jax.Device] | None = None) -> Any: ...


@dataclass(frozen=True)
class TaskFailure:
    """A task's answer when running it raised: the exception's class name and message, and
    the class itself (``error_class``) when it is one of shardscope's own errors, so that
    the caller can raise that error again where the task was asked for."""

    error_type: str
    message: str
    error_class: type[ShardscopeError] | None = None

    @classmethod
    def of(cls, error: BaseException) -> TaskFailure:
        """The failure that reports ``error``."""
        return cls(type(error).__name__, str(error), _own_error(type(error)))

    def __str__(self) -> str:
        return f"{self.error_type}: {self.message}"


def _own_error(kind: type[BaseException]) -> type[ShardscopeError] | None:
    """``kind`` when it is an error of :mod:`shardscope._src.base.errors` (a class pickles by
    its module and name, and every process running shardscope imports that module as this
    one does); None for any other class, which the caller may be unable to import."""
    own: object = getattr(errors, kind.__name__, None)
    if issubclass(kind, ShardscopeError) and own is kind:
        return kind
    return None


class LostTask(RuntimeError):
    """A task whose worker died on every try."""


def run_task(task: Task) -> Any:
    """``task.run()``, or the :class:`TaskFailure` of what it raised: the caller reports it
    per candidate, as it reports a compile that failed in its own process."""
    try:
        return task.run()
    except Exception as e:
        return TaskFailure.of(e)
