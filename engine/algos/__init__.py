"""The registered draft algorithms: one folder each, imported here explicitly (one line per algorithm).

`ALGOS` maps a name (= `speculators_model_type`) to its `DraftAlgorithm`. Importing this package
imports no torch.
"""

from engine.algos.base import (ALGOS, AlgoArgs, DraftAlgorithm, Objective, algorithm_for_config, default_algo,
                               load_plugins, register_algorithm)

from engine.algos import eagle3  # noqa: E402,F401  (registration)
from engine.algos import dflash  # noqa: E402,F401  (registration)
from engine.algos import peagle  # noqa: E402,F401  (registration)
from engine.algos import dspark  # noqa: E402,F401  (registration)

load_plugins()  # WORKBENCH_ALGO_PLUGINS: algorithms kept outside the tree

__all__ = ["ALGOS", "AlgoArgs", "DraftAlgorithm", "Objective", "algorithm_for_config", "default_algo",
           "load_plugins", "register_algorithm"]
