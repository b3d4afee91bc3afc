"""Scripts torchvision models, a transformer encoder and an LSTM, and traces a
ResNet-18, a model with tensor constants and a transformers BERT, for
metamem's TorchScript conformance test: python3 script_models.py OUT_DIR."""
import os
import sys

import torch
import torchvision
import transformers


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


class Scaled(torch.nn.Module):
    """A convolution and a batch norm scaled and shifted by tensors made in
    forward, which torch.jit.trace keeps as graph constants (three, with the
    batch norm's count)."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x)) * torch.tensor(0.5) + torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])


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
    # torch.jit.trace records aten::_convolution, with the cuDNN flags of
    # the moment, where torch.jit.script keeps aten::conv2d.
    traced = torch.jit.trace(torchvision.models.resnet18(), torch.randn(2, 3, 64, 64))
    torch.jit.save(traced, os.path.join(out, "resnet18_traced.pt"))
    torch.jit.save(torch.jit.trace(Scaled(), torch.randn(2, 3, 8, 8)), os.path.join(out, "constants_traced.pt"))
    # A transformers encoder as its docs trace one (torchscript=True): its
    # forward reads a tensor constant's value.
    bert = transformers.BertModel(transformers.BertConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000,
        torchscript=True, return_dict=False))
    traced = torch.jit.trace(bert, torch.zeros(2, 16, dtype=torch.long), strict=False, check_trace=False)
    torch.jit.save(traced, os.path.join(out, "bert_traced.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
