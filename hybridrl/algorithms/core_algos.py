"""verl's module name for the algorithm functions (docs/CONTRACTS.md points here): a re-export of
hybridrl.algorithms, so `from hybridrl.algorithms.core_algos import compute_policy_loss` and
`from hybridrl.algorithms import compute_policy_loss` name the same function."""

from hybridrl.algorithms import *  # noqa: F403
from hybridrl.algorithms import __all__  # noqa: F401
