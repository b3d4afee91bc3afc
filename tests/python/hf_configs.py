"""The transformers architectures the sweeps train, and their configs: the
published size and a reduced one (2 layers, width 64). It imports only
transformers, so that real torch on the fake GPU builds the same models
(fake_gpu_sweep.py) as hf_sweep.py traces."""

# Every architecture swept, by transformers model type, with the head it
# trains (metamem.hf.task_of picks it).
ARCHITECTURES = [
    # decoders (causal LM), dense and mixture-of-experts
    "gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi", "phi3", "falcon", "gpt_neox",
    "opt", "bloom", "gptj", "codegen", "olmo", "stablelm", "starcoder2", "granite", "mixtral", "qwen2_moe",
    # encoders (masked LM)
    "bert", "roberta", "distilbert", "albert", "electra", "deberta-v2", "xlm-roberta",
    # encoder-decoders
    "t5", "bart", "mbart", "pegasus", "marian", "whisper",
    # vision and vision-language
    "vit", "deit", "swin", "convnext", "clip", "siglip",
]

# A reduced size: each attribute a config has (by its name or transformers'
# alias of it) set, in its sub-configs (CLIP's text and vision) too.
REDUCED = {
    "num_hidden_layers": 2, "num_layers": 2, "num_decoder_layers": 2, "encoder_layers": 2, "decoder_layers": 2,
    "hidden_size": 64, "intermediate_size": 128, "n_inner": 128, "ffn_dim": 128, "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128, "d_ff": 128, "num_attention_heads": 4, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "d_kv": 16, "vocab_size": 256,
    "max_position_embeddings": 128, "max_target_positions": 128, "max_source_positions": 16,
    "num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64, "image_size": 32, "patch_size": 8, "embed_dim": 32,
    "depths": [1, 1], "num_heads": [2, 4], "window_size": 4, "hidden_sizes": [16, 32], "num_stages": 2,
    "embedding_size": 64, "projection_dim": 32, "projection_size": 64, "rotary_dim": 8, "decoder_vocab_size": 256,
}
# Token ids a config names, kept inside the reduced vocabulary.
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
             "cls_token_id", "forced_eos_token_id")
# What a published config sets and transformers' default config lacks.
# RoBERTa's positions start after its padding id (1): roberta-base and
# xlm-roberta-base publish 514 of them, for 512 tokens; transformers'
# default of 512 holds 510 (a longer sequence indexes past its table).
PUBLISHED = {"t5": {"decoder_start_token_id": 0}, "roberta": {"max_position_embeddings": 514},
             "xlm-roberta": {"max_position_embeddings": 514}}
# Where the reduced size above does not fit an architecture's own rules.
REDUCED_FOR = {
    "swin": {"patch_size": 4},
    "t5": {"num_heads": 4},
    "convnext": {"num_heads": None},
}
BATCH, SEQ, FULL_SEQ = 2, 16, 512


def published(model_type):
    """transformers' default config of `model_type` with what its published
    config sets beside (PUBLISHED)."""
    import transformers

    cfg = transformers.AutoConfig.for_model(model_type)
    for key, value in PUBLISHED.get(model_type, {}).items():
        setattr(cfg, key, value)
    return cfg


def reduced(model_type):
    """published(model_type) at the reduced size: REDUCED (and
    REDUCED_FOR's) values set wherever the config has them."""
    cfg = published(model_type)
    values = {**REDUCED, **REDUCED_FOR.get(model_type, {})}

    def settable(config, key, value):
        if value is None or not hasattr(config, key) or isinstance(getattr(config, key), dict):
            return False
        prop = getattr(type(config), key, None)
        if isinstance(prop, property) and prop.fset is None:  # derived (Falcon's head_dim)
            return False
        return isinstance(getattr(config, key), (list, tuple)) == isinstance(value, list)

    def shrink(config):
        for key, value in values.items():
            if settable(config, key, value):
                setattr(config, key, value)
        vocab = getattr(config, "vocab_size", None)
        for key in TOKEN_IDS:
            token = getattr(config, key, None)
            if isinstance(token, int) and vocab and token >= vocab:
                setattr(config, key, vocab - 1)
        for key in getattr(config, "sub_configs", {}):
            if getattr(config, key, None) is not None:
                shrink(getattr(config, key))
    shrink(cfg)
    return cfg
