"""CUDA graph trees in a fake-cuda trace: torch.compile's
mode="reduce-overhead" (and "max-autotune"), run by Inductor's own code
(torch/_inductor/cudagraph_trees.py) against the trace's allocator.

The trees keep each graph's outputs in the graphs' private pool and reason
about them by address, reference count and deleter: a warm-up routes the
thread's requests to the pool, a recording captures into it, a replay makes
its outputs as storages at the recorded addresses without allocating, and a
new generation (the next training step) frees the last one's outputs while
Python may still hold them. What they ask of c10 is answered here for
traced storages, from the simulated allocator (metamem._metamem): every
other storage gets torch's own function.

A tree that switches paths (an evaluation after training steps, a batch of
another shape) returns the pool to the layout it had after an earlier
recording (_cuda_setCheckpointPoolState), as the trace's allocator does
with its own checkpoints (docs/compile.md)."""

import torch

from . import _metamem
from ._compile_cuda import cannot_follow


class _Checkpoint:
    """A pool's layout as the trace's allocator keeps it, by number: what
    _cuda_getCheckpointState gives the tree to hand back."""

    def __init__(self, number):
        self.number = number


def _install(set_, session, captures, unowned):
    """Patches, with `set_` (metamem._cuda.Patches.set), for the trace of
    `session` whose CUDA graphs are `captures` (metamem._cuda._Captures).
    The pool's routing of a warm-up is metamem._cuda's, as use_mem_pool's.
    `unowned` holds, by address, the blocks a restore gave back that no
    storage owns, until the tree frees them."""
    C = torch._C

    def for_traced(name, instead):
        """C.name, with `instead` where its first argument (a storage's
        _cdata, as trees name storages) is a traced storage."""
        original = getattr(C, name)

        def chosen(cdata, *args):
            storage = torch.UntypedStorage._new_with_weak_ptr(cdata)
            return instead(storage, *args) if _metamem.is_traced_storage(storage) else original(cdata, *args)
        set_(C, name, chosen)

    # cuBLAS's workspaces are freed around each warm-up and recording, so
    # that the next product makes its own in the pool.
    set_(C, "_cuda_clearCublasWorkspaces", session.clear_cublas_workspaces)
    set_(C, "_cuda_isHistoryEnabled", lambda: False)
    # Outputs by address: a replay's storages lie at the recorded addresses
    # and own no block; a new generation frees the blocks of the last one's
    # outputs, which Python may still hold.
    original_tensor_from = C._construct_CUDA_Tensor_From_Storage_And_Metadata

    def storage_at(data_ptr, device, nbytes):
        return _metamem.traced_storage_at(data_ptr, nbytes).untyped_storage()

    def tensor_from(metadata, source):
        if not _metamem.is_traced_storage(source):
            return original_tensor_from(metadata, source)
        return torch.empty(0, dtype=metadata["dtype"], device="cuda").set_(
            source, metadata["storage_offset"], metadata["size"], metadata["stride"])

    set_(C, "_construct_storage_from_data_pointer", storage_at)
    set_(C, "_construct_CUDA_Tensor_From_Storage_And_Metadata", tensor_from)
    for_traced("_free_And_Remove_DeleterFn", lambda s: _metamem.free_traced_storage_now(s, s.data_ptr()))
    for_traced("_has_Standard_Deleter", _metamem.traced_storage_owns_buffer)
    # Reading a freed output's address raises the trees' message, as in
    # torch; reading its data is left to ops, which a trace runs.
    for_traced("_set_storage_data_ptr_access_error_msg", _metamem.set_traced_storage_access_error)
    original_access_message = C._set_storage_access_error_msg

    def access_message(tensor, message):
        if not _metamem.is_traced(tensor):
            original_access_message(tensor, message)
    set_(C, "_set_storage_access_error_msg", access_message)
    original_equal = C._tensors_data_ptrs_at_indices_equal

    def data_ptrs_equal(tensors, data_ptrs, indices):
        if not any(isinstance(t, torch.Tensor) and _metamem.is_traced(t) for t in tensors):
            return original_equal(tensors, data_ptrs, indices)
        return all(tensors[i].data_ptr() == data_ptrs[i] for i in indices)
    set_(C, "_tensors_data_ptrs_at_indices_equal", data_ptrs_equal)
    # A recording keeps the pool's layout; a tree that switches paths puts
    # it back, and frees the outputs that died since (raw_delete).
    set_(C, "_cuda_getCheckpointState",
         lambda device, handle: _Checkpoint(session.checkpoint_pool(captures.number(handle))))
    original_restore = C._cuda_setCheckpointPoolState

    def restore(device, state, stale_storages, live_storages):
        if not isinstance(state, _Checkpoint):
            return original_restore(device, state, stale_storages, live_storages)
        if stale_storages:  # Inductor's trees pass none
            raise cannot_follow("a return to a pool's checkpoint that frees stale storages")
        live = [torch.UntypedStorage._new_with_weak_ptr(cdata) for cdata in live_storages]
        unowned.update(session.restore_pool(state.number, live))
    set_(C, "_cuda_setCheckpointPoolState", restore)
    original_delete = C._cuda_cudaCachingAllocator_raw_delete

    def raw_delete(ptr):
        if ptr in unowned:
            del unowned[ptr]  # the byte tensor that held the block frees it
        else:
            original_delete(ptr)
    set_(C, "_cuda_cudaCachingAllocator_raw_delete", raw_delete)
    # Inductor's checks (triton.slow_path_cudagraph_asserts, on by default):
    # the pool's allocated blocks are the live outputs it knows of.
    set_(C, "_cuda_checkPoolLiveAllocations", lambda device, handle, expected: (
        set(session.pool_allocations(captures.number(handle))) == set(expected)))


class TracedTrees:
    """The trace's own tree managers, one per device: a tree is keyed by
    device in the thread's storage, so a process's real trees (on a real
    GPU) and the trace's stay apart. Its trees are shut down when the trace
    ends, and c10's cached tensors are enabled again only if a real tree
    had enabled them."""

    def __init__(self):
        self.containers = {}
        self.cached_tensors_before = None  # whether a real tree had enabled them; None until used
        self.unowned = {}  # blocks a restore gave back that no storage owns, by address

    def install(self, set_, session, captures):
        """The trace's answers for c10 (_install)."""
        _install(set_, session, captures, self.unowned)

    def use(self, patches):
        """Patches for a trace that compiles (metamem._compile_cuda.install)."""
        from torch._inductor import cudagraph_trees

        if self.cached_tensors_before is None:
            self.cached_tensors_before = torch._C._is_key_in_tls("tree_manager_containers") and any(
                container.tree_manager is not None
                for container in cudagraph_trees.get_obj(cudagraph_trees.local, "tree_manager_containers").values())
        patches.set(cudagraph_trees, "get_container", self.container)
        patches.set(cudagraph_trees.MarkStepBox, "mark_step_counter", cudagraph_trees.MarkStepBox.mark_step_counter)

    def container(self, device_index):
        from torch._inductor.cudagraph_trees import TreeManagerContainer

        if device_index not in self.containers:
            self.containers[device_index] = TreeManagerContainer(device_index)
        return self.containers[device_index]

    def shut_down(self):
        """At the trace's end, while its answers for c10 still stand."""
        for container in self.containers.values():
            if container.tree_manager is not None:
                container.tree_manager.shutdown()
        self.containers.clear()
        self.unowned.clear()
        if self.cached_tensors_before is not None:
            torch._C._set_cached_tensors_enabled(self.cached_tensors_before)

