"""One training example as the loss sees it: token ids and their labels, and the label the loss skips.

Below both the data pipeline (trainer/data/, which makes examples) and the loss (trainer/train_step/loss.py, which
reads them), so neither imports the other for these two facts. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the label of a token the loss does not count (a prompt token, padding): PyTorch's ignore_index
IGNORE = -100


@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]
