"""DistributedDataParallel in a trace.

DDP keeps its gradient buckets in a C++ Reducer, which a trace cannot run:
it compares storages by their data pointers (a traced tensor has none on a
fake cpu) and times each step with device events (a fake cuda has no CUDA
runtime). Inside trace(world_size=N, rank=r), DDP builds this Reducer
instead: the same buckets, made and freed when the C++ one makes and frees
them (torch/csrc/distributed/c10d/reducer.cpp, torch 2.14), so a rank holds
what the real one holds:

- at construction, one flat gradient buffer a bucket, as DDP assigns them
  (in torch 2.14 all parameters in one, or with find_unused_parameters the
  last ones' bucket capped at 1 MiB and the others at bucket_cap_mb), and
  with find_unused_parameters or static_graph a map of the parameters
  used, on the host and on the device;
- in backward, as each parameter's gradient is accumulated, its copy into
  the bucket divided by the world size; each bucket, once full and its
  predecessors reduced, all-reduced (or given to the communication hook);
  at the end of backward each gradient copied back out of its bucket (made
  like its parameter where it had none);
- before the second forward, the buckets rebuilt in the order gradients
  arrived (the first capped at 1 MiB, the others at bucket_cap_mb; the old
  ones freed first), after a broadcast of the new assignment;
- a gradient that is a view of its bucket with gradient_as_bucket_view.

torch's Python DDP runs as it is around it: the parameter broadcast at
construction, buffers broadcast before each forward, _DDPSink. The check
that every rank has the same parameters (one all-gather of their count, one
broadcast of their shapes) is made as the real one makes it, less reading
what other ranks sent, which a trace does not have."""

import weakref

import torch
import torch.distributed as dist
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch._C._distributed_c10d import AllgatherOptions

_UNSET = -1


class TracedGradBucket:
    """What a communication hook is handed: dist.GradBucket's methods over a
    bucket of this Reducer."""

    def __init__(self, index, count, buffer, parameters, bucket):
        self._index, self._count, self._buffer, self._parameters, self._bucket = \
            index, count, buffer, parameters, bucket

    def index(self):
        return self._index

    def is_last(self):
        return self._index == self._count - 1

    def buffer(self):
        return self._buffer

    def set_buffer(self, buffer):
        self._buffer = buffer
        self._bucket.gradients = buffer

    def parameters(self):
        return list(self._parameters)

    def gradients(self):
        return _views_of(self._buffer, self._bucket)


def _views_of(tensor, bucket):
    """Each parameter's view of a bucket's flat `tensor`, laid out as the
    parameter is where it is dense (the gradient layout contract), else
    row-major."""
    views = []
    for variable, offset, length in zip(bucket.variables, bucket.offsets, bucket.lengths):
        if _dense(variable):
            views.append(tensor.as_strided(variable.size(), variable.stride(), offset))
        else:
            views.append(tensor.narrow(0, offset, length).view(variable.size()))
    return views


class _Bucket:
    def __init__(self, variable_indices, params, sparse):
        self.variable_indices = list(variable_indices)
        self.variables = [params[index] for index in self.variable_indices]
        self.sparse = sparse
        self.offsets, self.lengths = [], []
        offset = 0
        for variable in self.variables:
            self.offsets.append(offset)
            self.lengths.append(variable.numel())
            offset += variable.numel()
        self.gradients = None
        self.views_in = self.views_out = []
        self.pending = 0
        self.future = None


class TracedReducer:
    """dist.Reducer's interface, as DistributedDataParallel calls it."""

    def __init__(self, params, bucket_indices, per_bucket_size_limits, process_group, expect_sparse_gradients,
                 bucket_bytes_cap, find_unused_parameters, gradient_as_bucket_view, param_names,
                 first_bucket_bytes_cap, skip_all_reduce_unused_params=False, use_python_reducer=False,
                 bucket_size_limits_for_rebuilding=(), batched_grad_copy=False):
        if not params:
            raise RuntimeError("Expected at least one parameter.")
        if skip_all_reduce_unused_params or batched_grad_copy:
            raise NotImplementedError("metamem: DistributedDataParallel's skip_all_reduce_unused_params and "
                                      "batched_grad_copy are not traced")
        self._params = list(params)
        self._group = process_group
        self._expect_sparse = list(expect_sparse_gradients) or [False] * len(self._params)
        # The buckets' caps when they are rebuilt in the order gradients
        # arrived (the first bucket smaller), where the user gave none.
        self._rebuilt_caps = list(bucket_size_limits_for_rebuilding) or [first_bucket_bytes_cap, bucket_bytes_cap]
        self._find_unused = find_unused_parameters
        self._as_bucket_view = gradient_as_bucket_view
        self._static_graph = False
        self._comm_hook = None  # (state, hook)
        self._mixed_precision_dtype = None
        self._expect_hooks = False
        self._first_hook_called = False
        self._backward_calls = 0
        self._next_bucket = 0
        self._has_marked_unused = False
        self._unused = []
        self._ready = set()
        self._has_rebuilt = False
        self._rebuilt_params, self._rebuilt_indices = [], []
        self._div_factor = _UNSET
        self._hooks_triggered = [0] * len(self._params)
        self._hooks_triggered_this_iteration = []
        self._local_used = self._local_used_dev = self._local_used_work = None
        self._local_used_reduced = False
        self._buckets, self._locators = [], []
        self._initialize_buckets(bucket_indices)
        # The C++ Reducer's post hooks on each parameter's gradient
        # accumulator, removed when it dies.
        reducer = weakref.ref(self)
        self._accumulators, handles = [], []
        for index, param in enumerate(self._params):
            accumulator = torch.autograd.graph.get_gradient_edge(param).node
            self._accumulators.append(accumulator)
            handles.append(accumulator.register_hook(
                lambda grad_inputs, grad_outputs, index=index: _fire(reducer, index)))
        weakref.finalize(self, _remove, handles)
        if find_unused_parameters:
            self._initialize_local_used_map()

    # -- buckets ------------------------------------------------------------

    def _initialize_buckets(self, bucket_indices):
        if self._expect_hooks:
            raise RuntimeError("`initialize_buckets` must NOT be called during autograd execution.")
        self._buckets = []  # the old buffers go before the new ones are made
        self._locators = [None] * len(self._params)
        for bucket_index, indices in enumerate(bucket_indices):
            if not indices:
                raise RuntimeError("Empty bucket specified.")
            sparse = len(indices) == 1 and self._expect_sparse[indices[0]]
            bucket = _Bucket(indices, self._params, sparse)
            if not sparse:
                first = bucket.variables[0]
                for variable in bucket.variables:
                    if variable.device != first.device:
                        raise RuntimeError("All parameters in a bucket must be placed on the same device.")
                    if variable.dtype != first.dtype:
                        raise RuntimeError("All parameters in a bucket must have the same dtype.")
                dtype = self._mixed_precision_dtype or first.dtype
                bucket.gradients = torch.empty(sum(bucket.lengths), dtype=dtype, device=first.device)
                self._initialize_bucket_views(bucket)
            for intra_index, variable_index in enumerate(indices):
                self._locators[variable_index] = (bucket_index, intra_index)
            self._buckets.append(bucket)

    def _initialize_bucket_views(self, bucket):
        bucket.views_in = bucket.views_out = _views_of(bucket.gradients, bucket)
        if self._as_bucket_view:
            for variable, view in zip(bucket.variables, bucket.views_in):
                grad = variable.grad
                if grad is not None and not _aliases(grad, view):
                    view.copy_(grad)
                    variable.grad = view

    def _initialize_local_used_map(self):
        count = len(self._params)
        self._local_used = torch.zeros(count, dtype=torch.int32)
        self._local_used_dev = torch.empty(count, dtype=torch.int32, device=self._params[0].device)

    # -- backward -----------------------------------------------------------

    def _dynamic_graph_find_unused(self):
        return not self._static_graph and self._find_unused

    def _static_graph_first_iteration(self):
        return self._static_graph and self._backward_calls == 1

    def _static_graph_after_first_iteration(self):
        return self._static_graph and self._backward_calls > 1

    def _should_rebuild_buckets(self):
        return (self._static_graph or not self._find_unused) and not self._has_rebuilt

    def _autograd_hook(self, index):
        if not self._first_hook_called:
            self._first_hook_called = True
            self._backward_calls += 1
        if self._dynamic_graph_find_unused() or self._static_graph_first_iteration():
            if self._params[index].grad is not None:
                self._local_used[index] = 1
        if self._static_graph_first_iteration():
            self._hooks_triggered[index] += 1
            return
        if not self._expect_hooks:
            return
        if not self._has_marked_unused:
            self._has_marked_unused = True
            for unused in self._unused:
                self._mark_variable_ready(unused)
        if self._static_graph_after_first_iteration():
            if self._hooks_triggered_this_iteration[index] <= 0:
                raise RuntimeError("Your training graph has changed in this iteration, e.g., one parameter is "
                                   "unused in first iteration, but then got used in the second iteration. this is "
                                   "not compatible with static_graph set to True.")
            self._hooks_triggered_this_iteration[index] -= 1
            if self._hooks_triggered_this_iteration[index] > 0:
                return
        if self._should_rebuild_buckets():
            self._push_rebuilt_params(index)
        self._mark_variable_ready(index)

    def _push_rebuilt_params(self, index):
        self._rebuilt_params.append(self._params[index])
        self._rebuilt_indices.append(index)

    def _set_divide_factor(self):
        if self._div_factor == _UNSET:
            self._div_factor = self._group.size()

    def _mark_variable_ready(self, index):
        if index in self._ready:
            raise RuntimeError(f"Expected to mark a variable ready only once. Parameter at index {index} has been "
                               "marked as ready twice.")
        self._ready.add(index)
        bucket_index, _ = self._locators[index]
        bucket = self._buckets[bucket_index]
        self._set_divide_factor()
        if bucket.sparse:
            raise NotImplementedError("metamem: DDP's sparse gradients are not traced (a trace follows strided "
                                      "tensors only)")
        self._mark_variable_ready_dense(index)
        bucket.pending -= 1
        if bucket.pending == 0:
            self._mark_bucket_ready(bucket_index)
        if self._next_bucket == len(self._buckets):
            if self._dynamic_graph_find_unused():
                self._all_reduce_local_used_map()
            reducer = weakref.ref(self)
            torch.autograd.Variable._execution_engine.queue_callback(lambda: reducer()._end_of_backward())

    def _end_of_backward(self):
        if self._static_graph_after_first_iteration() and self._should_rebuild_buckets():
            for unused in self._unused:
                self._push_rebuilt_params(unused)
        self._finalize_backward()

    def _mark_variable_ready_dense(self, index):
        bucket_index, intra_index = self._locators[index]
        bucket = self._buckets[bucket_index]
        view = bucket.views_in[intra_index]
        variable = bucket.variables[intra_index]
        grad = variable.grad
        if grad is None:
            view.zero_()
            return
        if not _aliases(grad, view):
            if self._comm_hook is None:
                # Divided as it is copied in: at::mul_out with a wrapped scalar.
                if not grad.requires_grad:
                    torch.mul(grad, 1.0 / self._div_factor, out=view)
                else:
                    view.copy_(torch.mul(grad, 1.0 / self._div_factor))
            else:
                view.copy_(grad)
            if self._as_bucket_view:
                variable.grad = view
        elif self._comm_hook is None:
            view.div_(self._div_factor)

    def _mark_bucket_ready(self, bucket_index):
        if bucket_index > self._next_bucket:
            return
        while self._next_bucket < len(self._buckets) and self._buckets[self._next_bucket].pending == 0:
            self._all_reduce_bucket(self._buckets[self._next_bucket])
            self._next_bucket += 1

    def _all_reduce_bucket(self, bucket):
        grad_bucket = TracedGradBucket(self._next_bucket, len(self._buckets), bucket.gradients, bucket.variables,
                                       bucket)
        bucket.future = self._run_comm_hook(grad_bucket)

    def _run_comm_hook(self, grad_bucket):
        if self._comm_hook is None:
            return self._run_allreduce_hook(grad_bucket)
        state, hook = self._comm_hook
        return hook(state, grad_bucket)

    def _run_allreduce_hook(self, grad_bucket):
        return self._group.allreduce([grad_bucket.buffer()], dist.AllreduceOptions()).get_future()

    def _all_reduce_local_used_map(self):
        if self._local_used_dev.device.type == "cuda":
            # Through a pinned copy, as the C++ Reducer avoids a race there.
            staged = torch.empty_like(self._local_used, pin_memory=True)
            staged.copy_(self._local_used)
            self._local_used_dev.copy_(staged, non_blocking=True)
        else:
            self._local_used_dev.copy_(self._local_used, non_blocking=True)
        self._local_used_work = self._group.allreduce([self._local_used_dev], dist.AllreduceOptions())

    def _finalize_backward(self):
        self._expect_hooks = False
        self._first_hook_called = False
        for bucket in self._buckets:
            bucket.future.wait()
            result = bucket.future.value()
            result = result[0] if isinstance(result, (list, tuple)) else result
            bucket.views_out = _views_of(result, bucket)
            self._div_factor = _UNSET
            self._finalize_bucket_dense(bucket)
            bucket.future = None
        if self._dynamic_graph_find_unused():
            self._local_used.fill_(0)
            self._local_used_reduced = False

    def _finalize_bucket_dense(self, bucket):
        for intra_index, variable in enumerate(bucket.variables):
            global_unused = False
            if self._static_graph or self._find_unused:
                # Whether any rank used it, which the reduced map of use
                # tells; a trace knows its own rank's use and takes every
                # rank's to be the same.
                global_unused = bucket.variable_indices[intra_index] in self._unused
                if global_unused and not self._local_used_reduced:
                    self._local_used_work.wait()
                    self._local_used.copy_(self._local_used_dev)
                    self._local_used_reduced = True
            if global_unused:  # its gradient is left as it was
                continue
            view_out = bucket.views_out[intra_index]
            if not self._as_bucket_view:
                grad = variable.grad
                if grad is None:
                    variable.grad = _clone_obeying_contract(view_out, variable)
                else:
                    grad.copy_(view_out)
            else:
                view_in = bucket.views_in[intra_index]
                if not _aliases(view_in, view_out):
                    view_in.copy_(view_out)
                if variable.grad is None:
                    variable.grad = view_in

    # -- what DistributedDataParallel calls ---------------------------------

    def prepare_for_forward(self):
        pass

    def prepare_for_backward(self, outputs):
        self._expect_hooks = True
        self._next_bucket = 0
        for bucket in self._buckets:
            bucket.pending = len(bucket.variables)
        if self._static_graph:
            self._hooks_triggered_this_iteration = list(self._hooks_triggered)
        self._has_marked_unused = False
        self._ready = set()
        if self._dynamic_graph_find_unused():
            self._unused = self._search_unused_parameters(outputs)

    def _search_unused_parameters(self, outputs):
        seen, queue = set(), [output.grad_fn for output in outputs if output.grad_fn is not None]
        while queue:
            for node, _ in queue.pop().next_functions:
                if node is not None and node not in seen:
                    seen.add(node)
                    queue.append(node)
        return [index for index, accumulator in enumerate(self._accumulators) if accumulator not in seen]

    def _rebuild_buckets(self):
        if not self._should_rebuild_buckets() or not self._rebuilt_params:
            return False
        indices, _ = dist._compute_bucket_assignment_by_size(
            self._rebuilt_params, self._rebuilt_caps, self._expect_sparse,
            self._rebuilt_indices)
        self._sync_bucket_indices(indices)
        self._has_rebuilt = True
        self._rebuilt_params, self._rebuilt_indices = [], []
        self._initialize_buckets(indices)
        return True

    def _sync_bucket_indices(self, indices):
        """Rank 0's assignment broadcast to all: the indices and the bucket
        count, then the buckets' sizes, each from the host through the
        device."""
        device = self._params[0].device
        for values in (sum(indices, []) + [len(indices)], [len(bucket) for bucket in indices]):
            host = torch.empty(len(values), dtype=torch.int32)
            on_device = torch.empty(len(values), dtype=torch.int32, device=device)
            on_device.copy_(host, non_blocking=True)
            self._group.broadcast([on_device], dist.BroadcastOptions()).wait()
            host.copy_(on_device)
            del host, on_device

    def _push_all_rebuilt_params(self):
        if not self._should_rebuild_buckets() or self._rebuilt_indices:
            return
        for index in range(len(self._params)):
            self._push_rebuilt_params(index)

    def _set_static_graph(self):
        if self._backward_calls > 0:
            raise RuntimeError("set_static_graph() should be called before training loop starts and after "
                               "DistributedDataParallel is constructed.")
        self._static_graph = True
        self._initialize_local_used_map()

    def _delay_all_reduce(self):
        """static_graph's first backward: everything reduced at its end."""
        self._all_reduce_local_used_map()
        self._unused = [index for index, count in enumerate(self._hooks_triggered) if count == 0]
        for index in range(len(self._params)):
            self._set_divide_factor()
            self._mark_variable_ready_dense(index)
        for bucket in self._buckets:
            self._all_reduce_bucket(bucket)
        self._finalize_backward()

    def _set_comm_hook(self, state, hook):
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        self._comm_hook = (state, hook)

    def _set_mixed_precision_param_dtype(self, dtype):
        self._mixed_precision_dtype = dtype
        for bucket in self._buckets:
            bucket.gradients = bucket.gradients.to(dtype)

    def _get_zeros_like_grad_buckets(self):
        return [TracedGradBucket(index, len(self._buckets), torch.zeros_like(bucket.gradients), bucket.variables,
                                 bucket) for index, bucket in enumerate(self._buckets)]

    def _get_local_used_map(self):
        return self._local_used_dev

    def _check_reducer_finalized(self):
        pass

    def _ddp_graph_static(self):
        return True

    def _set_ddp_runtime_logging_sample_rate(self, sample_rate):
        pass

    def set_logger(self, logger):
        pass

    def get_backward_stats(self):
        return [0] * len(self._params)

    def __getattr__(self, name):
        raise NotImplementedError(f"metamem: DistributedDataParallel's {name} is not traced (its C++ Reducer is "
                                  "modelled by metamem._ddp)")


def _fire(reducer, index):
    alive = reducer()
    if alive is not None:
        alive._autograd_hook(index)


def _remove(handles):
    for handle in handles:
        handle.remove()


def _dense(tensor):
    return is_non_overlapping_and_dense_or_false(tensor)


def _aliases(a, b):
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def _clone_obeying_contract(view, variable):
    """A new gradient laid out as AccumulateGrad lays one out: like a dense
    parameter, else row-major."""
    if _dense(variable):
        if view.stride() == variable.stride():
            return view.clone(memory_format=torch.preserve_format)
        return torch.empty_strided(variable.size(), variable.stride(), dtype=variable.dtype,
                                   device=variable.device).copy_(view)
    return view.clone(memory_format=torch.contiguous_format)


class TracedLogger:
    """dist.Logger's interface: a trace logs nothing."""

    def __init__(self, reducer):
        self._data = {}

    def set_construction_data_and_log(self, *args):
        pass

    def set_runtime_stats_and_log(self):
        pass

    def set_error_and_log(self, message):
        pass

    def _set_comm_hook_name(self, name):
        self._data["comm_hook"] = name

    def _set_static_graph(self):
        pass

    def _set_uneven_input_join(self):
        pass

    def _get_ddp_logging_data(self):
        return dict(self._data)


def verify_param_shape_across_processes(process_group, tensors, logger=None):
    """c10d's verify_params_across_processes as it allocates: the parameter
    count all-gathered, then every size and stride broadcast through the
    device and read back into a host tensor. What other ranks sent is not
    known to a trace: it is not compared."""
    if not tensors:
        return
    device = tensors[0].device
    count = torch.tensor([len(tensors)], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(count) for _ in range(process_group.size())]
    process_group.allgather([gathered], [count], AllgatherOptions()).wait()
    del count, gathered
    entries = sum(2 * tensor.dim() for tensor in tensors)
    metadata = torch.empty(entries, dtype=torch.int64)
    metadata_dev = metadata.clone().to(device)
    process_group.broadcast([metadata_dev], dist.BroadcastOptions()).wait()
    control = torch.empty(entries, dtype=torch.int64)
    control.copy_(metadata_dev)


def register_comm_hook(reducer, state, hook):
    reducer._set_comm_hook(state, hook)


def register_builtin_comm_hook(reducer, comm_hook_type):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hooks = {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
             dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}
    reducer._set_comm_hook(reducer._group, hooks[comm_hook_type])


def install(patches):
    """DDP builds metamem's Reducer and Logger for the block."""
    import torch.nn.parallel.distributed as ddp

    patches.set(dist, "Reducer", TracedReducer)
    patches.set(dist, "Logger", TracedLogger)
    patches.set(dist, "_register_comm_hook", register_comm_hook)
    patches.set(dist, "_register_builtin_comm_hook", register_builtin_comm_hook)
    patches.set(ddp, "_verify_param_shape_across_processes", verify_param_shape_across_processes)
