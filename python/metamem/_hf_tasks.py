"""The head a transformers model trains and the synthetic batch it takes,
as metamem.hf trains it. This module imports only torch and transformers
(not metamem's C++), so that real torch on the fake GPU can load it by its
path and train the same heads on the same inputs
(tests/python/fake_gpu_sweep.py)."""

import torch

__all__ = ["TASKS", "task_of", "inputs"]

# The head a model trains with, the first its type has in this order:
# encoder-decoders before the causal-LM head some of them also have,
# masked-LM encoders (BERT) before their causal-LM variant, CLIP's
# contrastive pair before a classifier on its vision tower.
TASKS = {
    "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "speech": "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "masked": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "causal": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "contrastive": "MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "image": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
}


def _mappings():
    from transformers.models.auto import modeling_auto
    return {task: getattr(modeling_auto, name) for task, name in TASKS.items()}


def task_of(cfg):
    """The task whose head trains: the config's own architecture's, else the
    first of TASKS its model type has."""
    mappings = {task: {model_type: names if isinstance(names, (list, tuple)) else (names,)
                       for model_type, names in mapping.items()} for task, mapping in _mappings().items()}
    for architecture in cfg.architectures or ():
        for task, mapping in mappings.items():
            if architecture in mapping.get(cfg.model_type, ()):
                return task, architecture
    for task, mapping in mappings.items():
        if cfg.model_type in mapping:
            return task, mapping[cfg.model_type][0]
    raise ValueError(f"metamem.hf trains {', '.join(TASKS)} heads; {cfg.model_type} has none of them")


def _image_size(cfg):
    size = cfg.image_size
    return tuple(size) if isinstance(size, (list, tuple)) else (size, size)


def inputs(cfg, task, batch, seq, device, dtype):
    """Synthetic inputs of the shapes the task's model takes, labels included."""
    def tokens(config, length):
        return torch.randint(0, config.vocab_size, (batch, length), device=device)

    def pixels(config):
        return torch.randn(batch, config.num_channels, *_image_size(config), device=device, dtype=dtype)

    if task in ("causal", "masked", "seq2seq"):
        ids = tokens(cfg, seq)
        return {"input_ids": ids, "labels": ids}
    if task == "speech":
        features = torch.randn(batch, cfg.num_mel_bins, 2 * cfg.max_source_positions, device=device, dtype=dtype)
        return {"input_features": features, "labels": tokens(cfg, min(seq, cfg.max_target_positions))}
    if task == "image":
        return {"pixel_values": pixels(cfg), "labels": torch.randint(0, cfg.num_labels, (batch,), device=device)}
    text, vision = cfg.text_config, cfg.vision_config
    return {"input_ids": tokens(text, min(seq, text.max_position_embeddings)), "pixel_values": pixels(vision),
            "return_loss": True}
