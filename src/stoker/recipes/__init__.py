"""Training recipes: complete, runnable model + ``model_fn`` + ``input_fn`` s built on stoker.

Each recipe module has a keyword-only config dataclass, a ``train_<name>(config)`` entry, and
``add_arguments(parser)`` / ``run(args)`` for the command line; ``stoker train <recipe>``
(:mod:`stoker.recipes.cli`) lists every recipe declared in the ``stoker.recipes`` entry points.
All of that but the model, the data and the metrics is the shared skeleton
(:mod:`stoker.recipes.skeleton`, whose docstring shows a whole recipe in one file);
:mod:`stoker.recipes.corpus` is the text corpus and held-out split of the text recipes.
Recipes sit above the engine: they may import anything of stoker but the CLI and the harness,
and nothing of stoker imports them by name.

- ``charlm``: a Transformer-XL-style character language model whose segment memory is carried
  from step to step through ``EstimatorSpec.cache`` (see docs/charlm.md).
- ``bert``: a small byte-level BERT masked-LM pretraining, the showcase of activation
  recompute and bf16 weights with stochastic rounding (see docs/bert.md).
"""
