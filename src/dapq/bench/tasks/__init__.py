"""Task generators of the accuracy benchmarks, registered by name.

``build_samples(name, tokenizer, args)`` turns a task set's name and the user's :class:`TaskArgs`
into :class:`Sample` objects; each task set lives in its own module and registers itself with
:func:`taskset`. Importing this package imports them all.
"""

from . import helmet, longbench, niah, ruler  # noqa: F401  (registration)
from .base import TASKSETS, Sample, TaskArgs, build_samples, fit_to_length, select_tasks, taskset
from .haystack import NOISE, haystack_text, sentences

__all__ = ["NOISE", "TASKSETS", "Sample", "TaskArgs", "build_samples", "fit_to_length", "haystack_text",
           "select_tasks", "sentences", "taskset"]
