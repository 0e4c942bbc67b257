"""A user's file of blocks and a model that names them, for the tests of --modules."""

import textwrap

from models.yolo import yaml_model_load

BLOCKS = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Scale(nn.Module):
        """x times a learned factor per channel."""

        channel_rule = "width"

        def __init__(self, c1, c2):
            super().__init__()
            assert c1 == c2
            self.g = nn.Parameter(torch.full((1, c1, 1, 1), 0.5))

        def forward(self, x):
            return x * self.g


    class Blur(nn.Module):
        """x plus its 3 x 3 mean; channels pass through (no channel_rule)."""

        def forward(self, x):
            return x + nn.functional.avg_pool2d(x, 3, 1, 1)
''')


def with_rows(*rows):
    """yolov8n with `rows` after its SPPF (layer 9); later 'from' indices moved along."""
    d = yaml_model_load("yolov8n.yaml")
    k = len(rows)
    d["backbone"] += [list(r) for r in rows]
    d["head"] = [[[x + k if isinstance(x, int) and x > 9 else x for x in r[0]] if isinstance(r[0], list) else r[0],
                  *r[1:]] for r in d["head"]]
    return d
