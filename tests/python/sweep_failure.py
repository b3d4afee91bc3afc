"""How the sweeps name a model that failed."""
import traceback

import metamem


def why(error):
    """The error's kind and where the model's code met it: the innermost
    frame outside torch's internals (torch.nn.init counts as model code)."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if "/torch/" not in frame.filename or frame.filename.endswith("torch/nn/init.py")]
    where = ""
    if frames:
        frame = frames[-1]
        where = f" in {frame.name} ({frame.filename.split('site-packages/')[-1]}:{frame.lineno})"
    if isinstance(error, metamem.ValueReadError):
        return "reads a value" + where
    message = str(error).strip().splitlines()[0][:100] if str(error).strip() else ""
    return f"{type(error).__name__}{where}" + (f": {message}" if message else "")
