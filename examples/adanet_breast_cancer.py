r"""AdaNet on scikit-learn's breast_cancer: the same run as ``stoker adanet breast_cancer``.

Breast cancer (binary, 30 features): an AutoEnsembleEstimator over a logistic regression
and a DNN, both plain nn.Modules with their own Adam optimizers.

    python examples/adanet_breast_cancer.py [--model_dir runs/adanet/breast_cancer] [--max_iterations 3] \
        [--seed 0] [--fresh]

Rerunning with the same --model_dir resumes the search where it stopped (kill it at any
moment), or only reports once it is done. The builders, generators and the run itself are in
src/stoker/adanet/recipes.py; docs/adanet.md explains the API.
"""

from __future__ import annotations

import sys

from stoker.adanet.cli import main

if __name__ == "__main__":
    sys.exit(main(["breast_cancer", *sys.argv[1:]]))
