"""Scripts torchvision models, a transformer encoder and an LSTM for metamem's
TorchScript conformance test: python3 script_models.py OUT_DIR."""
import os
import sys

import torch
import torchvision


class Encoder(torch.nn.Module):
    """nn.TransformerEncoder with a classifier head: tokens in, logits out."""

    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128,
                                                 batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=2)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))


class Recurrent(torch.nn.Module):
    """A 2-layer LSTM over (time, batch, features) and a classifier of its
    last step: its flat weights are an attribute, a list of its parameters."""

    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(32, 64, num_layers=2)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.lstm(x)[0][-1])


class Distinct(torch.nn.Module):
    """Calls an op that has no meta kernel: its output's size depends on the values (aten::_unique2)."""

    def forward(self, x):
        return torch.unique(x) * 2


def main(out):
    os.makedirs(out, exist_ok=True)
    models = {
        "resnet18": torchvision.models.resnet18(),
        "mobilenet_v2": torchvision.models.mobilenet_v2(),
        "vgg11": torchvision.models.vgg11(num_classes=10),
        "transformer": Encoder(),
        "lstm": Recurrent(),
        "unsupported_op": Distinct(),
    }
    for name, model in models.items():
        torch.jit.save(torch.jit.script(model), os.path.join(out, name + ".pt"))


if __name__ == "__main__":
    main(sys.argv[1])
