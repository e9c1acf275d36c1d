"""AdaNet on scikit-learn's diabetes: the same run as ``stoker adanet diabetes``.

Diabetes (regression, 10 features): DNN candidates of depth d and d+1 with complexity
sqrt(depth) and learned mixture weights, for several adanet_lambda values. A larger lambda
shrinks the mixture weights of the deeper subnetworks (and at lambda=1 the search keeps
linear models only).

    python examples/adanet_diabetes.py [--model_dir runs/adanet/diabetes] [--max_iterations 3] [--seed 0] [--fresh]

Rerunning with the same --model_dir resumes the search where it stopped (kill it at any
moment), or only reports once it is done. The builders, generators and the run itself are in
src/stoker/adanet/recipes.py; docs/adanet.md explains the API.
"""

from __future__ import annotations

import sys

from stoker.adanet.cli import main

if __name__ == "__main__":
    sys.exit(main(["diabetes", *sys.argv[1:]]))
