"""The registered draft algorithms: one folder each, imported here explicitly (one line per algorithm).

`ALGOS` maps a name (= `speculators_model_type`) to its `DraftAlgorithm`; importing a folder also registers its
config type (`engine.format.config.CONFIG_TYPES`). Importing this package imports no torch.
"""

from engine.algos.base import (
    ALGOS,
    AlgoArgs,
    DecoderArgs,
    DraftAlgorithm,
    DraftArgs,
    Objective,
    algorithm_for_config,
    algorithm_names,
    default_algo,
    load_plugins,
    register_algorithm,
)

# registration order is the algorithms' order everywhere (the first is the default): kept, not sorted
# isort: off
from engine.algos import eagle3  # noqa: E402,F401  (registration)
from engine.algos import dflash  # noqa: E402,F401  (registration)
from engine.algos import peagle  # noqa: E402,F401  (registration)
from engine.algos import dspark  # noqa: E402,F401  (registration)
from engine.algos import dflash2  # noqa: E402,F401  (registration)
# isort: on

load_plugins()  # WORKBENCH_ALGO_PLUGINS: algorithms kept outside the tree

__all__ = ["ALGOS", "AlgoArgs", "DecoderArgs", "DraftAlgorithm", "DraftArgs", "Objective", "algorithm_for_config",
           "algorithm_names", "default_algo", "load_plugins", "register_algorithm"]
