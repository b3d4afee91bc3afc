// HostTensors: where a fake-cuda trace puts what code makes on the host.
#pragma once

namespace metamem {

// Where a fake-cuda trace puts what code makes on the host (a factory that
// names no device, or the CPU). OnDevice: on the traced GPU, so that a
// block that builds its model and inputs without .cuda() traces them there.
// OnHost: on the host, as a real run of code written for a GPU does (a
// script's in-memory dataset, the batches a DataLoader collates): such a
// tensor claims the CPU, holds none of the device's memory and is not
// recorded; an op runs on the host where it names the CPU or none of its
// tensors is on the device, and .cuda(), .to("cuda") copy onto the device.
// A fake-cpu trace's host is its device: the two are one there.
enum class HostTensors { OnDevice, OnHost };

}  // namespace metamem
