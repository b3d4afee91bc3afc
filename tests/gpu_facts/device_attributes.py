"""Every CUdevice_attribute of device 0 as the CUDA driver answers it, and
torch's device properties, as JSON on stdout: run on a GPU machine and on
the fake GPU (its libcuda.so.1 preloaded, as real_torch_on_fake_gpu.py
starts a child) to see what the fake driver answers otherwise. cuDNN's
heuristics read some of these (docs/cuda-paths.md)."""
import ctypes
import json
import os

FIRST_UNKNOWN = 200  # past CUDA 13's last attribute; the driver answers an error for those


def main():
    cuda = ctypes.CDLL("libcuda.so.1")
    if cuda.cuInit(0) != 0:
        raise RuntimeError("cuInit failed: no GPU")
    device = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(device), 0)
    attributes = {}
    for attribute in range(1, FIRST_UNKNOWN):
        value = ctypes.c_int()
        status = cuda.cuDeviceGetAttribute(ctypes.byref(value), attribute, device)
        attributes[attribute] = value.value if status == 0 else f"error {status}"
    version, name, memory = ctypes.c_int(), ctypes.create_string_buffer(256), ctypes.c_size_t()
    cuda.cuDriverGetVersion(ctypes.byref(version))
    cuda.cuDeviceGetName(name, len(name), device)
    cuda.cuDeviceTotalMem_v2(ctypes.byref(memory), device)
    found = {"driver": version.value, "name": name.value.decode(), "total_memory": memory.value,
             "attributes": attributes}
    import torch
    properties = torch.cuda.get_device_properties(0)
    found["torch"] = {key: str(getattr(properties, key)) for key in dir(properties) if not key.startswith("_")}
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    main()
    os._exit(0)  # the fake GPU's runtime can abort on a normal exit; the answer is out
