#!/bin/bash
# Installs the TensorFlow peer that benchmarks/cnn.py and benchmarks/preprocessing.py run beside
# stoker: tf_cnn_benchmarks (github.com/tensorflow/benchmarks) on TensorFlow 2.21 for the CPU, in
# a virtual environment of its own. It is a measuring tool, never a dependency of stoker.
#
# Usage: benchmarks/peers/setup-tf-cnn.sh [SOURCE]
#   SOURCE: where to clone tensorflow/benchmarks from (a URL or a local git directory);
#           default https://github.com/tensorflow/benchmarks
# Installs into $PEERS_DIR (default ~/.cache/stoker-peers), the folder the scripts look in.
set -eu
peers=${PEERS_DIR:-$HOME/.cache/stoker-peers}
source_repo=${1:-https://github.com/tensorflow/benchmarks}
mkdir -p "$peers"
if [[ ! -d $peers/benchmarks ]]; then
  git clone -q "$source_repo" "$peers/benchmarks"
fi
if [[ ! -x $peers/tfvenv/bin/python ]]; then
  python3 -m venv "$peers/tfvenv"
  "$peers/tfvenv/bin/pip" install -q tensorflow-cpu==2.21.0 tf-keras==2.21.0 absl-py
fi
echo "tf_cnn_benchmarks is ready in $peers/benchmarks/scripts/tf_cnn_benchmarks (Python: $peers/tfvenv/bin/python)"
