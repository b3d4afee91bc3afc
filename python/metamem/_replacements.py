"""The tensors from before a block that its modules hold replacements of in
it, put back as it ends."""

import weakref

import torch

from . import _metamem


class Replacements:
    """Module slots (a module's parameters and buffers) whose tensor from
    before the block stands replaced in it: by `modules=` at its start, or
    by a module's .to(), .cuda() in it, which make new tensors where torch
    would move a real one in place (a traced tensor is not of a real one's
    kind). Each slot is put back when the block ends, so the module runs
    after it as before; of(tensor) answers where an optimizer built before
    the block holds the tensor it replaced."""

    def __init__(self):
        self.undo = []  # callables putting back what the block changed, called in reverse
        self.replaced = {}  # id of a tensor from before the block: a weak reference to its replacement

    def set(self, store, name, value, owner=None):
        """store[name] = value until restore(). With `owner`, (module, the
        name of its store: "_parameters" or "_buffers"), the module is held
        weakly, not its store: one the block made and lets go is freed with
        its tensors, as in a real run, and nothing is put back in it."""
        before = store[name]
        if owner is None:
            self.undo.append(lambda: store.__setitem__(name, before))
        else:
            module, kind = weakref.ref(owner[0]), owner[1]

            def put_back():
                if (alive := module()) is not None:
                    getattr(alive, kind)[name] = before
            self.undo.append(put_back)
        store[name] = value

    def replace(self, store, name, replacement, owner=None):
        """store[name], a tensor, replaced by `replacement` until restore().
        Only the modules hold replacements, as only a moved module holds its
        tensors: one the model lets go (a buffer it replaces in forward) is
        freed then. It takes the tensor's hooks (_carry_hooks). `owner`: as
        for set()."""
        original = store[name]
        if self.of(original) is not replacement:  # met again in a second slot (tied weights)
            _carry_hooks(original, replacement)
            self.replaced[id(original)] = weakref.ref(replacement)
        self.set(store, name, replacement, owner)

    def put(self, store, name, replacement):
        """store[name] = replacement, put back by restore() where store[name]
        is from before the block (a real tensor; a traced one is the block's)."""
        if _metamem.is_traced(store[name]):
            store[name] = replacement
        else:
            self.replace(store, name, replacement)

    def of(self, tensor):
        """The tensor's replacement while it lives, else None."""
        found = self.replaced.get(id(tensor))
        return None if found is None else found()

    def current(self, tensor):
        """What stands for the tensor in the block: its replacement, or itself."""
        return _either(self.of(tensor), tensor)

    def restore(self):
        for undo in reversed(self.undo):
            undo()
        self.undo.clear()
        self.replaced.clear()

    def patch_module_moves(self, patches):
        """nn.Module._apply (.to(), .cuda(), .half()) in the block records
        what it replaced of the module's own tensors from before the block
        (its children's calls record theirs). A tensor two modules share (a
        head tied to its embedding), which torch moves in place once, has
        one replacement: the first made."""
        apply = torch.nn.Module._apply
        replacements = self

        def moving(self, fn, recurse=True):
            # Only those from before the block are held here: a traced buffer
            # the move replaces is freed as torch frees it, before the next is made.
            before = [(kind, name, tensor, _Contents.of(tensor)) for kind in ("_parameters", "_buffers")
                      for name, tensor in getattr(self, kind).items()
                      if tensor is not None and not _metamem.is_traced(tensor)]
            result = apply(self, fn, recurse)
            for kind, name, tensor, contents in before:
                store = getattr(self, kind)
                # A ScriptModule's stores (OrderedDictWrapper) have no get().
                moved = store[name] if name in store else tensor
                if moved is not tensor:
                    store[name] = tensor  # as it was, for replace() to keep
                    replacements.replace(store, name, _either(replacements.of(tensor), moved), (self, kind))
                elif contents is not None and contents.changed():
                    replacements.undo.append(contents.put_back)
            return result

        patches.set(torch.nn.Module, "_apply", moving)


class _Contents:
    """What a real tensor from before the block holds: its data and its
    gradient. A move that runs for real on it (.half() or .to(dtype) of a
    model left real, on a fake cpu) sets both in place (`param.data = ...`),
    as torch does where the new tensor is of the old one's kind; they are
    put back as the block ends."""

    @classmethod
    def of(cls, tensor):
        """Those of a plain tensor with values, on the CPU, else None. A meta
        one (torchtitan builds its model on the meta device in the block,
        and FSDP makes its parameters DTensors) has no values to put back."""
        plain = type(tensor) in (torch.Tensor, torch.nn.Parameter)
        return cls(tensor) if plain and tensor.device.type == "cpu" else None

    def __init__(self, tensor):
        self.tensor, self.data, self.grad = tensor, tensor.data, tensor.grad
        self.grad_data = None if self.grad is None else self.grad.data

    def changed(self):
        grad = self.tensor.grad
        return (not _same(self.tensor, self.data) or grad is not self.grad
                or (grad is not None and not _same(grad, self.grad_data)))

    def put_back(self):
        # The data first: a gradient is set only on a tensor of its kind.
        self.tensor.data = self.data
        if self.grad is not None:
            self.grad.data = self.grad_data
        self.tensor.grad = self.grad


def _same(tensor, data):
    """Whether `tensor` still holds the real `data` it held. A tensor
    without storage (a sparse one, whose data_ptr() raises) is compared
    by its kind alone."""
    if _metamem.is_traced(tensor) or tensor.dtype != data.dtype or tensor.device != data.device:
        return False
    return not torch._C._has_storage(tensor) or tensor.data_ptr() == data.data_ptr()


def _either(replacement, tensor):
    return tensor if replacement is None else replacement


def _carry_hooks(original, replacement):
    """The hooks registered on a parameter before the block, on its
    replacement, as they stay on a parameter torch moves in place: those on
    its gradient as they are, those run after its gradient accumulates (an
    optimizer stepped in backward) called with the parameter they were
    registered on, by which such a hook finds its optimizer (which steps
    the replacement, _optimizers), lent the replacement's gradient."""
    for hook in (original._backward_hooks or {}).values():
        replacement.register_hook(hook)
    for hook in (original._post_accumulate_grad_hooks or {}).values():
        replacement.register_post_accumulate_grad_hook(
            lambda _, hook=hook: _run_with_lent_grad(hook, original, replacement))


def _run_with_lent_grad(hook, original, replacement):
    """hook(original), with original.grad the replacement's as the hook runs
    (a hook reads p.grad: a norm logged, a sum kept). A gradient the hook
    sets on it (None, to free it) becomes the replacement's. The lending
    skips torch's checks: on fake cuda the original stays on the host."""
    lent = replacement.grad
    had = _metamem.exchange_grad(original, lent)
    try:
        hook(original)
    finally:
        left = _metamem.exchange_grad(original, had)
        if left is not lent:
            replacement.grad = left
