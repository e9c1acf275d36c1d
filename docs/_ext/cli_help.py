"""Regenerate docs/cli.md from the ``stoker`` command's own help text.

    .venv/bin/python docs/_ext/cli_help.py     # from the repository root; rewrites docs/cli.md

Run it after changing a command's flags; the help is captured at 100 columns so the page does
not depend on the terminal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STOKER = [sys.executable, "-m", "stoker"]

INTRO = """\
# Command line

`stoker` is installed with the package (`python -m stoker` is the same, also under
`torchrun`). Each subcommand's parser lives in its package's `cli.py` (the
[API reference](api/cli.md) lists them); `stoker --help` answers without importing torch.
Usage errors (unknown or contradictory flags, bad values) exit with status 2 and a message
naming the flag and the allowed values.

```sh
stoker bench --model=resnet20 --data_name=cifar10 --batch_size=32 --data_format=NHWC   # tf_cnn_benchmarks flags
stoker bench --list_models                                  # the zoo, with parameters and GFLOPs
stoker bench --mode=inference --model=resnet50 --num_inference_threads=2
torchrun --nproc_per_node=2 -m stoker bench --model=resnet20 --data_name=cifar10 --variable_update=replicated
stoker bench --num_gpus=2 --model=resnet20 --data_name=cifar10    # the same, launched by stoker (torch's elastic agent)
stoker train charlm --model_dir runs/charlm                 # character LM with segment memory
stoker adanet digits                                        # AdaNet search on scikit-learn's digits
stoker evaluate runs/charlm --watch                         # evaluate each new checkpoint beside training
stoker inspect runs/charlm && stoker plot runs/charlm --out curves.png
stoker export runs/charlm --out exported/charlm --aot && stoker serve exported/charlm/model.aoti.pt2 --port 8080
stoker checkpoint consolidate runs/big                      # one model.safetensors from a sharded checkpoint
stoker checkpoint verify runs/charlm                        # every file of every checkpoint against its sha256
stoker checkpoint repair runs/charlm --dry-run              # what rebuilding a lost or damaged index would write
stoker info                                                 # versions and the devices torch sees
```

The help below is the commands' own (`stoker COMMAND --help`), regenerated with
`python docs/_ext/cli_help.py`.
"""

# (heading, argv, guide link or "", collapsed)
SECTIONS = [
    ("stoker", [], "", False),
    ("stoker bench", ["bench"], "[stoker bench](bench.md)", True),
    ("stoker train", ["train"], "", False),
    ("stoker train charlm", ["train", "charlm"], "[the character LM recipe](charlm.md)", True),
    ("stoker train bert", ["train", "bert"], "[the BERT recipe](bert.md)", True),
    ("stoker evaluate", ["evaluate"], "[evaluation beside training](evaluation.md)", False),
    ("stoker adanet", ["adanet"], "[AdaNet](adanet.md)", False),
    ("stoker export", ["export"], "[export and serving](export.md)", False),
    ("stoker serve", ["serve"], "[export and serving](export.md#stoker-serve-export-port-p)", False),
    ("stoker inspect", ["inspect"], "[seeing a run](seeing_a_run.md)", False),
    ("stoker plot", ["plot"], "[seeing a run](seeing_a_run.md)", False),
    ("stoker checkpoint", ["checkpoint"], "[checkpoints](checkpoints.md)", False),
    ("stoker checkpoint consolidate", ["checkpoint", "consolidate"], "", False),
    (
        "stoker checkpoint list",
        ["checkpoint", "list"],
        "[checkpoints](checkpoints.md#stoker-checkpoint-list-verify-repair)",
        False,
    ),
    ("stoker checkpoint verify", ["checkpoint", "verify"], "", False),
    ("stoker checkpoint repair", ["checkpoint", "repair"], "", False),
    ("stoker info", ["info"], "", False),
]


def help_text(argv: list[str]) -> str:
    env = dict(os.environ, COLUMNS="100", PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([*STOKER, *argv, "--help"], capture_output=True, text=True, env=env, check=True, cwd=ROOT)
    lines = out.stdout.rstrip().split("\n")
    if len(lines) > 40 and lines[0].startswith("usage:"):  # drop a usage block that only repeats the flags
        end = next(i for i, line in enumerate(lines) if not line.strip())
        lines = [f"usage: stoker {' '.join(argv)} [FLAGS]", *lines[end:]]
    return "\n".join(lines)


def render() -> str:
    """docs/cli.md as the commands' help makes it now."""
    parts = [INTRO]
    for heading, argv, guide, collapsed in SECTIONS:
        text = help_text(argv)
        parts.append(f"## `{heading}`\n")
        if guide:
            parts.append(f"Guide: {guide}.\n")
        if collapsed:
            body = "\n".join(f"    {line}" if line else "" for line in ["```text", *text.split("\n"), "```"])
            parts.append(f'??? note "`{heading} --help`"\n\n{body}\n')
        else:
            parts.append(f"```text\n{text}\n```\n")
    return "\n".join(parts)


def main() -> None:
    (ROOT / "docs" / "cli.md").write_text(render())


if __name__ == "__main__":
    main()
