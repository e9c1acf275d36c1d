"""AdaNet on scikit-learn's digits: the same run as ``stoker adanet digits``.

Digits (8x8 images, 10 classes): a linear baseline, the simple_dnn generator growing depth,
and a tiny-CNN generator growing convolutions. Prints every iteration's candidates with their
moving-average adanet_loss, the chosen architecture, and held-out accuracy of each ensemble
against its best single subnetwork.

    python examples/adanet_digits.py [--model_dir runs/adanet/digits] [--max_iterations 3] [--seed 0] [--fresh]

Rerunning with the same --model_dir resumes the search where it stopped (kill it at any
moment), or only reports once it is done. The builders, generators and the run itself are in
src/stoker/adanet/recipes.py; docs/adanet.md explains the API.
"""

from __future__ import annotations

import sys

from stoker.adanet.cli import main

if __name__ == "__main__":
    sys.exit(main(["digits", *sys.argv[1:]]))
