"""stoker's version, in a module of its own: modules that record it (export signatures, run
specs, benchmark reports) import it from here rather than from the package ``__init__``, which
imports the Estimator and so would close an import circle through them."""

__version__ = "0.1.0"
