"""Pipeline parallelism for transformers' decoders, as a user trains one
with torch's own pipelining: each pipeline rank builds its stage of the
model as transformers splits it for pipeline parallelism
(apply_pipeline_parallelism: the decoder layers in contiguous runs, the
remainder one each to the first stages; the embedding on the first stage,
the final norm and the head on the last; what a stage does not hold
replaced by transformers' PipelineIdentityLayer), and torch's Schedule1F1B
runs the step's microbatches through the stages. transformers' own
pipeline forward is for inference (it sends no gradients back); training
takes torch's schedule, which needs a module that takes one tensor and
gives one: StageModule."""

import torch

__all__ = ["pipeline_refusal", "stage_module", "Pipeline"]


def pipeline_refusal(config, stages):
    """Why a model of `config` (a transformers config) cannot be split into
    `stages` pipeline stages: its model has no pipeline plan in
    transformers (its config's base_model_pp_plan and its head's
    _pp_plan), the head metamem.hf trains does not predict tokens, or it
    has fewer layers than stages; None where it can."""
    import transformers

    from ._hf_tasks import task_of

    task, architecture = task_of(config)
    if task != "causal":
        return (f"pipeline parallelism splits decoders that predict tokens; {config.model_type} trains "
                f"{architecture} ({task})")
    if not getattr(config, "base_model_pp_plan", None) or not getattr(getattr(transformers, architecture), "_pp_plan",
                                                                      None):
        return f"{architecture} has no pipeline plan in transformers (base_model_pp_plan and _pp_plan)"
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(layers, int) or layers < stages:
        return f"{stages} pipeline stages need a layer each: {config.model_type} has {layers}"
    return None


def _layers_of(stage, stages, layers):
    """[start, end) of the layers transformers gives pipeline rank `stage`
    of `stages` (PipelineStage.layer_range_for_rank)."""
    each, remainder = divmod(layers, stages)
    start = stage * each + min(stage, remainder)
    return start, start + each + (stage < remainder)


class StageModule(torch.nn.Module):
    """A pipeline stage of a transformers causal LM, as torch's schedule
    calls it: tokens (first stage) or hidden states in; hidden states
    (transformers' last_hidden_state, before the final norm on all but the
    last stage) or, on the last stage, the logits out."""

    def __init__(self, model, first, last):
        super().__init__()
        self.model, self.first, self.last = model, first, last

    def forward(self, received):
        given = {"input_ids" if self.first else "inputs_embeds": received}
        if self.last:
            return self.model(**given).logits
        return getattr(self.model, self.model.base_model_prefix)(**given).last_hidden_state


def stage_module(model, stage, stages):
    """`model` (a causal LM, built on the meta device) cut down to pipeline
    rank `stage` of `stages` as transformers' apply_pipeline_parallelism
    cuts it, in a StageModule. Its base model's pipeline plan names its
    parts in order: those before the layers (the embedding, its dropout)
    are the first stage's, those after (the final norm) and the head's
    plan (the LM head) the last's. A model whose head shares the
    embedding's weight keeps the embedding on its last stage too, as
    transformers does: each of the two stages holds the weight."""
    from transformers.distributed.pipeline_parallel import PipelineIdentityLayer

    base = getattr(model, model.base_model_prefix)
    parts = list(model.config.base_model_pp_plan)
    layers = next(name for name in parts if isinstance(getattr(base, name), torch.nn.ModuleList))
    first, last = stage == 0, stage == stages - 1
    for index, name in enumerate(parts):
        before = index < parts.index(layers)
        tied = index == 0 and model.config.tie_word_embeddings
        if name != layers and not (first if before else last) and not (tied and last):
            setattr(base, name, PipelineIdentityLayer())
    blocks = getattr(base, layers)
    start, end = _layers_of(stage, stages, len(blocks))
    for index in range(len(blocks)):
        if not start <= index < end:
            blocks[index] = PipelineIdentityLayer()
    if not last:
        for name in type(model)._pp_plan:
            setattr(model, name, PipelineIdentityLayer())
    return StageModule(model, first, last)


class Pipeline:
    """torch's Schedule1F1B over a StageModule that pipeline rank `stage`
    of `stages` (in process group `group`) runs, for batches of `batch` x
    `seq` tokens in `microbatches`. torch's PipelineStage is told the shapes
    it receives and sends (under a trace's fake process group nothing is
    exchanged to learn them from): tokens [microbatch, seq] into the first
    stage, hidden states [microbatch, seq, hidden] in the model's dtype
    between stages, logits [microbatch, seq, vocabulary] out of the last,
    which the model's own loss function (transformers' loss_function, as
    its forward with labels computes it) takes with the labels. torch
    checks each forward against them."""

    def __init__(self, module, stage, stages, group, device, batch, seq, microbatches):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        config, dtype, microbatch = module.model.config, module.model.dtype, batch // microbatches
        self.first, self.last = stage == 0, stage == stages - 1
        hidden = torch.empty(microbatch, seq, config.hidden_size, dtype=dtype, device="meta", requires_grad=True)
        received = torch.empty(microbatch, seq, dtype=torch.long, device="meta") if self.first else hidden
        sent = hidden
        if self.last:
            sent = torch.empty(microbatch, seq, config.vocab_size, dtype=dtype, device="meta", requires_grad=True)
        loss = module.model.loss_function
        self.schedule = Schedule1F1B(
            PipelineStage(module, stage, stages, torch.device(device), input_args=(received,), output_args=(sent,),
                          group=group),
            n_microbatches=microbatches,
            loss_fn=lambda logits, labels: loss(logits=logits, labels=labels, vocab_size=config.vocab_size))

    def step(self, tokens, labels):
        """One forward and backward of the batch: the first stage takes the
        tokens, the last the labels."""
        if self.first:
            self.schedule.step(tokens)
        elif self.last:
            self.schedule.step(target=labels)
        else:
            self.schedule.step()
