"""What a run records about itself, and reading it back: events, ``metrics.csv``, ``stoker inspect``, ``stoker plot``.

Owns the writers that training and evaluation log through (:mod:`~stoker.summary.writer`:
TensorBoard event files without TensorFlow, and a CSV of the same values), the inspection of
a ``model_dir`` from its files alone and the plot of its curves (:mod:`~stoker.summary.inspect`),
and their commands (:mod:`~stoker.summary.cli`). It may import :mod:`stoker.storage`,
:mod:`stoker.checkpoint` (to read the index) and ``stoker.run_spec``; never the engine or the
Estimator. See docs/seeing_a_run.md.
"""

from .writer import CSV_NAME, EVENTS_DIR, EventFileWriter, ScalarWriter, read_metrics_csv

__all__ = ["CSV_NAME", "EVENTS_DIR", "EventFileWriter", "ScalarWriter", "read_metrics_csv"]
